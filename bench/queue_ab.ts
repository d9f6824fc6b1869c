/**
 * Two worker builds side by side, one caller: `VC_BASE=DIR npx tsx bench/queue_ab.ts [misses]`
 * with REDIS_URL (and DATABASE_URL, else an embedded PostgreSQL). DIR is another checkout's root
 * (`git archive REV src bench test/helpers | tar -x -C DIR`, its package.json and
 * tsconfig.json copied, `node_modules` linked): its `bench/queue_worker_process.ts` runs one
 * worker, this checkout's runs the other, each on a queue and cache prefix of its own, and
 * this process sends queued misses of the ~1 ms runnable to each in turn (order alternated),
 * with a bare BullMQ round trip after each pair, hosted by each worker process in turn. The
 * enqueuing side is this checkout's for both, so a difference is the workers'.
 *
 * Why: a queued miss's latency on this machine swings by a millisecond within minutes (the bare
 * BullMQ round trip alone measured 1.1–2.0 ms in one hour), so two builds measured in turn by
 * `queue_bench.ts` differ by more than any change to the worker. Interleaved miss by miss, they
 * share the swings. Run it once with `VC_BASE` at this checkout (A/A) to see the harness' own
 * bias: the process that hosts a bare round trip answers the next miss faster (≈ 0.4 ms when
 * one process hosted them all), which is why they alternate.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { dirname, join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import { RedisCacheStore, withResultCache } from '../src/index.js';
import { deleteKeys } from './fixtures.js';
import { benchPostgres } from './postgres_fixture.js';
import { bareRoundTrips, benchQueueExecutor } from './queue_floor.js';
import { QUEUE_BENCH_SECRET } from './queue_runnables.js';

const base = process.env['VC_BASE'];
if (base === undefined) {
  console.error('usage: VC_BASE=DIR npx tsx bench/queue_ab.ts [misses=400] (see the header)');
  process.exit(2);
}
const HERE = join(dirname(fileURLToPath(import.meta.url)), '..');
const REDIS_URL = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
const N = Number(process.argv[2] ?? 400);
// Unmeasured pairs first: the code measured should be optimised (see queue_bench.ts, WARM).
const WARM = 300;
const tag = randomBytes(4).toString('hex');

const pgServer = await benchPostgres();
const database = `vc_queue_ab_${tag}`;
await pgServer.createDatabase(database);
const databaseUrl = pgServer.url(database);

/** A worker process of the checkout at `root`, ready. */
async function startWorker(root: string, queuePrefix: string, cachePrefix: string) {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', join(root, 'bench', 'queue_worker_process.ts')],
    {
      cwd: root,
      env: {
        ...process.env,
        DATABASE_URL: databaseUrl,
        REDIS_URL,
        QUEUE_PREFIX: queuePrefix,
        CACHE_PREFIX: cachePrefix,
        CONCURRENCY: '32',
      },
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => line === 'ready' && resolve());
    child.once('exit', (code) => reject(new Error(`worker of ${root} exited ${code}`)));
  });
  return child;
}

const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
const seal = { secretKey: QUEUE_BENCH_SECRET };
const children: ChildProcess[] = [];
const stores: RedisCacheStore[] = [];
const sides: { name: string; miss: (i: number) => Promise<unknown>; bare: () => Promise<void> }[] =
  [];
const closers: (() => Promise<void>)[] = [];
for (const [name, root] of [
  ['base', base],
  ['this', HERE],
] as const) {
  const queuePrefix = `{vc-bench-ab-${name}-${tag}}`;
  const cachePrefix = `vc-bench:ab:${name}:${tag}:`;
  children.push(await startWorker(root, queuePrefix, cachePrefix));
  const { local, queue } = await benchQueueExecutor(redis, queuePrefix);
  const store = new RedisCacheStore({
    redis: REDIS_URL,
    prefix: cachePrefix,
    commandTimeout: 5000,
  });
  stores.push(store);
  const cache = withResultCache(queue, { store, seal });
  const bare = await bareRoundTrips(redis, queuePrefix);
  closers.push(
    () => bare.close(),
    () => queue.close(),
  );
  sides.push({
    name,
    bare: () => bare.trip('r'),
    miss: (i) =>
      cache.run(
        local.createJob({
          workspace: 'bench',
          path: 'work',
          runAs: 'pub@example.com',
          origin: { kind: 'app', session: { email: 'bench@example.com' } },
          args: { ab: i, side: name },
        }),
      ),
  });
}

const ms: Record<string, number[]> = { base: [], this: [], bare: [] };
for (let i = -WARM; i < N; i++) {
  for (const side of i % 2 === 0 ? sides : [...sides].reverse()) {
    const t = performance.now();
    await side.miss(i);
    if (i >= 0) ms[side.name]!.push(performance.now() - t);
  }
  const t = performance.now();
  await sides[(i + WARM) % 2]!.bare();
  if (i >= 0) ms['bare']!.push(performance.now() - t);
}

const at = (xs: number[], q: number) =>
  [...xs].sort((a, b) => a - b)[Math.floor(q * (xs.length - 1))]!;
console.log(`queued misses, one caller, ${N} each, interleaved (ms):`);
for (const [name, xs] of Object.entries(ms)) {
  console.log(`  ${name.padEnd(5)} p50 ${at(xs, 0.5).toFixed(3)}  p90 ${at(xs, 0.9).toFixed(3)}`);
}
console.log(`  this − base, p50: ${(at(ms['this']!, 0.5) - at(ms['base']!, 0.5)).toFixed(3)} ms`);

for (const close of closers) await close();
for (const child of children) {
  child.kill('SIGTERM');
  await once(child, 'exit');
}
for (const store of stores) await store.close();
await deleteKeys(redis, `{vc-bench-ab-*-${tag}}*`);
await deleteKeys(redis, `vc-bench:ab:*:${tag}:*`);
redis.disconnect();
await pgServer.close('vc_queue_ab_');
process.exit(0);
