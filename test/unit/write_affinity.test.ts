import { describe, expect, it } from 'vitest';
import { queuedRun, runQueued } from '../../src/queue/queued_run.js';
import { affinityFor, sameServer, withWriteAffinity } from '../../src/util/write_affinity.js';

// Which connection a store may write on instead of its own (src/util/write_affinity.ts): only one
// that lands on the very server, database and user, under the same key prefix, and is connected.
// The integration test (test/integration/redis/write_affinity.test.ts) watches a real server.

const base = { host: '127.0.0.1', port: 6379, db: 0, username: null, keyPrefix: '' };
const node = (options: object, status = 'ready') => ({ status, options: { ...base, ...options } });

describe('sameServer', () => {
  it('is true for two clients of one address, database, user and key prefix', () => {
    expect(sameServer(node({}), node({}))).toBe(true);
    // ioredis leaves db and keyPrefix out on some clients: their defaults are equal.
    expect(sameServer(node({ db: undefined, keyPrefix: undefined }), node({}))).toBe(true);
  });

  it.each([
    ['another host', { host: '10.0.0.2' }],
    ['another port', { port: 6380 }],
    ['a unix socket', { path: '/run/redis.sock' }],
    ['another database', { db: 3 }],
    ['another user', { username: 'queue' }],
    ['another key prefix', { keyPrefix: 'q:' }],
    ['TLS (its settings cannot be compared)', { tls: {} }],
    ['Sentinel (no fixed address)', { sentinels: [{ host: 'a', port: 26379 }] }],
  ])('is false for %s', (_what, options) => {
    expect(sameServer(node({}), node(options))).toBe(false);
    expect(sameServer(node(options), node({}))).toBe(false);
  });

  it('is false for a Cluster client or one without options', () => {
    expect(sameServer(node({}), { ...node({}), isCluster: true })).toBe(false);
    expect(sameServer(node({}), { status: 'ready' })).toBe(false);
  });
});

describe('affinityFor', () => {
  const own = node({});

  it('is null outside withWriteAffinity', () => {
    expect(affinityFor(own)).toBeNull();
  });

  it('is the connection set for the code running, while it is ready and compatible', async () => {
    const worker = node({});
    expect(withWriteAffinity(worker, () => affinityFor(own))).toBe(worker);
    // Through awaits too: the store writes after the job's own promise hops.
    const later = await withWriteAffinity(worker, async () => {
      await Promise.resolve();
      await new Promise((resolve) => setImmediate(resolve));
      return affinityFor(own);
    });
    expect(later).toBe(worker);
    expect(withWriteAffinity(node({}, 'reconnecting'), () => affinityFor(own))).toBeNull();
    expect(withWriteAffinity(node({ db: 2 }), () => affinityFor(own))).toBeNull();
    // The store's own client is not "another" connection.
    expect(withWriteAffinity(own, () => affinityFor(own))).toBeNull();
  });

  it("shares a queued job's one scope: both hold through awaits, and neither displaces the other", async () => {
    const worker = node({});
    const other = node({});
    const run = { depth: 2, childUrl: 'http://server.internal:8080' };
    expect(queuedRun()).toBeUndefined();
    const seen = await runQueued(run, worker, async () => {
      await new Promise((resolve) => setImmediate(resolve));
      const inside = { run: queuedRun(), via: affinityFor(own) };
      // An affinity set inside the job keeps the job's run; the job's returns after it.
      const nested = withWriteAffinity(other, () => ({ run: queuedRun(), via: affinityFor(own) }));
      return { inside, nested, after: affinityFor(own) };
    });
    expect(seen.inside).toEqual({ run, via: worker });
    expect(seen.nested.run).toBe(run);
    expect(seen.nested.via).toBe(other);
    expect(seen.after).toBe(worker);
    expect(queuedRun()).toBeUndefined();
    expect(affinityFor(own)).toBeNull();
  });
});
