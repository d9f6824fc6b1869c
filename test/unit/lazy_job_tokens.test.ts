import { describe, expect, it } from 'vitest';
import type { Job, JobTokenIssuer, RunContext } from '../../src/index.js';
import { createExecutor } from '../../src/index.js';
import { makeJob } from '../helpers/jobs.js';

// A lazy issuer (SharedJobTokens): the token is issued on the runnable's first read of
// `ctx.jobToken`, never after its job ended; a job that never reads it costs the issuer nothing.

class RecordingIssuer implements JobTokenIssuer {
  readonly issued: string[] = [];
  readonly revoked: string[] = [];
  constructor(readonly lazy: boolean) {}
  issue(job: Job): string {
    this.issued.push(job.id);
    return `vcjob_${job.id}`;
  }
  revoke(job: Job): void {
    this.revoked.push(job.id);
  }
}

const job = (path: string) => makeJob({ path, viewer: 'alice@example.com', hash: 'v1' });

function executorWith(issuer: JobTokenIssuer, kept: { ctx?: RunContext }) {
  return createExecutor({
    jobTokens: issuer,
    runnables: {
      silent: { hash: 'v1', fn: () => 'no token read' },
      reads: {
        hash: 'v1',
        fn: (_args, ctx) => {
          kept.ctx = ctx;
          return { first: ctx.jobToken, second: ctx.jobToken };
        },
      },
    },
  });
}

describe('job tokens of a lazy issuer', () => {
  it('a runnable that never reads ctx.jobToken is neither issued nor revoked a token', async () => {
    const issuer = new RecordingIssuer(true);
    await executorWith(issuer, {}).run(job('silent'));
    expect(issuer.issued).toEqual([]);
    expect(issuer.revoked).toEqual([]);
  });

  it('one that reads it gets one token, issued once, revoked when the job ends', async () => {
    const issuer = new RecordingIssuer(true);
    const kept: { ctx?: RunContext } = {};
    const j = job('reads');
    const result = await executorWith(issuer, kept).run(j);
    expect(result.value).toEqual({ first: `vcjob_${j.id}`, second: `vcjob_${j.id}` });
    expect(issuer.issued).toEqual([j.id]);
    expect(issuer.revoked).toEqual([j.id]);
    // The context kept past its job: the token it already had, nothing new issued.
    expect(kept.ctx?.jobToken).toBe(`vcjob_${j.id}`);
    expect(issuer.issued).toEqual([j.id]);
  });

  it('a token first read after its job ended is never issued', async () => {
    const issuer = new RecordingIssuer(true);
    const kept: { ctx?: RunContext } = {};
    const executor = createExecutor({
      jobTokens: issuer,
      runnables: {
        later: {
          hash: 'v1',
          fn: (_args, ctx) => {
            kept.ctx = ctx;
            return 'kept the context';
          },
        },
      },
    });
    await executor.run(job('later'));
    expect(kept.ctx?.jobToken).toBeNull();
    expect(issuer.issued).toEqual([]);
    expect(issuer.revoked).toEqual([]);
  });

  it('an issuer that is not lazy still issues before the code runs, read or not', async () => {
    const issuer = new RecordingIssuer(false);
    const j = job('silent');
    await executorWith(issuer, {}).run(j);
    expect(issuer.issued).toEqual([j.id]);
    expect(issuer.revoked).toEqual([j.id]);
  });
});
