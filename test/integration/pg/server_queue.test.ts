import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { asRun, httpRequest, pollUntil, sample } from '../../helpers/server_process.js';

// The reference server with VIEWER_CACHE_EXECUTION=queue and one `viewer-cache worker`, through
// the HTTP API: each viewer their rows, hits answered without the queue, the worker's liveness,
// metrics and log lines, and its graceful stop.

const WS = 'demo';
const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';
const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-e2e:${prefix}`,
  execution: 'queue',
});

const appRun = async (email: string, path: string) =>
  asRun(
    await e2e.request('POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
      token: demoToken(SECRET_KEY, email),
      body: { path },
    }),
  );

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
}, 120_000);

afterAll(async () => {
  await e2e.stop();
});

describe('a server in queue mode and one worker process', () => {
  it('readyz counts the live worker; the worker has a liveness port', async () => {
    await pollUntil(async () => (await e2e.request('GET', '/readyz')).status === 200, 15_000);
    const ready = JSON.parse((await e2e.request('GET', '/readyz')).text) as Record<string, unknown>;
    expect(ready['workers']).toBe(1);
    const worker = e2e.workers[0]!;
    const url = (await worker.ready).url;
    expect((await httpRequest(url, 'GET', '/healthz')).status).toBe(200);
  });

  it('each viewer their rows on a miss and on a hit; hits never reach the worker', async () => {
    const workerUrl = (await e2e.workers[0]!.ready).url;
    const jobsDone = async () => {
      const value = sample(
        (await httpRequest(workerUrl, 'GET', '/metrics')).text,
        'viewer_cache_worker_jobs_total',
        '{code="ok"}',
      );
      return Number.isNaN(value) ? 0 : value;
    };
    const before = await jobsDone();
    const aliceMiss = await appRun(ALICE, 'f/orders/list');
    const bobMiss = await appRun(BOB, 'f/orders/list');
    expect(aliceMiss.status, aliceMiss.text).toBe(200);
    expect(aliceMiss.fromCache).toBe(false);
    const regions = (rows: unknown) => [
      ...new Set((rows as { region: string }[]).map((r) => r.region)),
    ];
    expect(regions(aliceMiss.result)).toEqual(['emea']);
    expect(regions(bobMiss.result)).toEqual(['amer']);
    // At least these two (the demo's first scheduled run may be running on the worker too).
    expect((await jobsDone()) - before).toBeGreaterThanOrEqual(2);
    const beforeHits = await jobsDone();
    const aliceHit = await appRun(ALICE, 'f/orders/list');
    const bobHit = await appRun(BOB, 'f/orders/list');
    expect(aliceHit.fromCache).toBe(true);
    expect(bobHit.fromCache).toBe(true);
    expect(aliceHit.result).toEqual(aliceMiss.result);
    expect(bobHit.result).toEqual(bobMiss.result);
    expect((await jobsDone()) - beforeHits).toBe(0);
  });

  it('the worker logs one line per job: path, code, duration; never a viewer or rows', async () => {
    const worker = e2e.workers[0]!;
    const finishedLines = () => worker.lines.filter((line) => line.includes('"job finished"'));
    // Log lines are written in batches (at most 250 ms late).
    await pollUntil(async () => finishedLines().length >= 2, 5000);
    const finished = finishedLines();
    expect(finished.length).toBeGreaterThanOrEqual(2);
    for (const line of finished) {
      const parsed = JSON.parse(line) as Record<string, unknown>;
      expect(parsed['path']).toMatch(/^f\//);
      expect(typeof parsed['code']).toBe('string');
      expect(typeof parsed['ms']).toBe('number');
    }
    const all = worker.lines.join('\n') + worker.stderr;
    for (const needle of [ALICE, BOB, 'Acme GmbH', SECRET_KEY]) expect(all).not.toContain(needle);
  });

  it("a change to another data table's roles leaves a queued run's entry valid (invariant 17)", async () => {
    // The worker ran f/orders/list, so it learned that the runnable reads data table `main`
    // only, and shared that set: the server keys the run on it, not on the full fingerprint
    // (watched: with the worker's fingerprint untracked, Alice's next run below is a miss).
    expect((await appRun(ALICE, 'f/orders/list')).fromCache).toBe(true);
    const added = await e2e.cli(['groups', 'add', ALICE, 'providers']);
    expect(added.code, added.stderr).toBe(0);
    // Once the server sees her new role on the clinics data table (its detail stops refusing)…
    await pollUntil(async () => {
      const answer = await e2e.request('POST', `/api/w/${WS}/apps/clinics/run`, {
        token: demoToken(SECRET_KEY, ALICE),
        body: { path: 'f/clinics/patients' },
      });
      return answer.status === 200;
    }, 10_000);
    // …her orders entry, which depends on `main` alone, is still the one served.
    const again = await appRun(ALICE, 'f/orders/list');
    expect(again.status, again.text).toBe(200);
    expect(again.fromCache).toBe(true);
  });

  it('a child run over HTTP from the only worker slot completes: the child runs one queue deeper', async () => {
    // One worker of concurrency 1, held by the parent while it waits for its child: queued on
    // the parent's own queue, the child would never start (watched: this run waited for the
    // queue's 60 s and the test timed out). It goes to the depth-1 queue, which the worker
    // takes with a slot of its own (worker_children.test.ts proves where it ran). Carol's list
    // is not cached yet here.
    const started = performance.now();
    const answer = await appRun('carol@example.com', 'f/orders/remote_child');
    expect(answer.status, answer.text).toBe(200);
    const regions = new Set((answer.result as { region: string }[]).map((r) => r.region));
    expect([...regions].sort()).toEqual(['amer', 'emea']);
    expect(performance.now() - started).toBeLessThan(20_000);
  });

  it('SIGHUP (its terminal closed) stops a worker gracefully too: exit 0, its stop logged', async () => {
    // Node's default for SIGHUP is to die at once, mid-job: watched, signal SIGHUP, no line.
    const worker = await e2e.startWorker();
    worker.signal('SIGHUP');
    expect(await worker.closed).toEqual({ code: 0, signal: null });
    const stopping = worker.lines.filter((line) => line.includes('"msg":"worker stopping"'));
    expect(stopping).toHaveLength(1);
    expect(JSON.parse(stopping[0]!)).toMatchObject({ signal: 'SIGHUP' });
  });

  it('SIGTERM: the worker stops gracefully (exit 0) and leaves the heartbeat set', async () => {
    const worker = e2e.workers[0]!;
    worker.signal('SIGTERM');
    const exit = await worker.closed;
    expect(exit.code).toBe(0);
    await pollUntil(async () => {
      const ready = JSON.parse((await e2e.request('GET', '/readyz')).text) as Record<
        string,
        unknown
      >;
      return ready['workers'] === 0;
    }, 10_000);
  });
});
