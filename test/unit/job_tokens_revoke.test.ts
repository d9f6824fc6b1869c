import { describe, expect, it } from 'vitest';
import type { Job } from '../../src/index.js';
import { JobTokens } from '../../src/server/credentials/tokens.js';

// The server's job tokens tell who listens when a job's token dies: that is how the query
// proxy hears that a job an agent held ended (finished, timed out, lost, the server stopping)
// and rolls back the transactions it left open (issue 33, item 7).

const job = (id: string): Job => ({
  id,
  workspace: 'demo',
  runnable: { path: 'f/x', hash: 'h' },
  args: {},
  perms: { email: 'publisher@example.com', endUserEmail: 'alice@example.com' },
});

describe('JobTokens.onRevoke', () => {
  it('tells every listener of each job whose token dies, once, with the job it was issued for', () => {
    const tokens = new JobTokens();
    const heard: Job[] = [];
    const heardToo: string[] = [];
    tokens.onRevoke((ended) => heard.push(ended));
    tokens.onRevoke((ended) => heardToo.push(ended.id));
    const a = job('a');
    const b = job('b');
    const tokenA = tokens.issue(a);
    tokens.issue(b);
    tokens.revoke(a);
    expect(heard).toEqual([a]);
    expect(heard[0]).toBe(a);
    expect(tokens.jobOfToken(tokenA)).toBeNull();
    // Again, or a job never issued a token: nobody is told.
    tokens.revoke(a);
    tokens.revoke(job('never'));
    expect(heard).toEqual([a]);
    tokens.revoke(b);
    expect(heardToo).toEqual(['a', 'b']);
  });
});
