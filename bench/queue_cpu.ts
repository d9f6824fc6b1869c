/**
 * Where a queued miss's CPU goes: `npx tsx bench/queue_cpu.ts [--rounds 3] [--misses 2000]`
 * with REDIS_URL (the machine's `redis-server`, whose CPU it reads) and DATABASE_URL (else an
 * embedded PostgreSQL).
 *
 * One worker process (`queue_worker_process.ts`, concurrency 32) and 32 callers in this process
 * run, in alternating rounds, queued misses of the ~1 ms runnable and bare BullMQ round trips
 * doing the same work in the same worker process. Per round it prints the rate and the CPU time
 * per miss of each process — this one (callers and the enqueuing side), the worker, and
 * redis-server — from `/proc/<pid>/stat`, so that a throughput gap can be put on the process
 * that pays it; and the write syscalls per miss of the worker and of this process, with the
 * bytes they wrote (`/proc/<pid>/io`: sockets mostly). `VC_QUEUE_CPU_WORKER_ARGS`: node flags
 * for the worker (`--cpu-prof --cpu-prof-dir=…`). `VC_QUEUE_BENCH_SPIN_MS=0`: the
 * runnable does no work, leaving the queue's own cost per miss. A figure to read, not a target:
 * `queue_bench.ts` has the ratios. `--only queued|bare`: one kind of round alone.
 */
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { Redis } from 'ioredis';
import pg from 'pg';
import { migrateQueue, RedisCacheStore, withResultCache } from '../src/index.js';
import { deleteKeys } from './fixtures.js';
import { benchPostgres } from './postgres_fixture.js';
import {
  bareRoundTrips,
  benchQueueExecutor,
  startQueueWorker,
  stopQueueWorker,
} from './queue_floor.js';
import { QUEUE_BENCH_SECRET } from './queue_runnables.js';

const REDIS_URL = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
const CALLERS = 32;
const arg = (name: string, fallback: number) => {
  const at = process.argv.indexOf(`--${name}`);
  return at === -1 ? fallback : Number(process.argv[at + 1]);
};
const ROUNDS = arg('rounds', 3);
const MISSES = arg('misses', 2000);
/** `--only queued` or `--only bare`: one kind of round alone (a worker profile of one side). */
const ONLY = process.argv.includes('--only')
  ? process.argv[process.argv.indexOf('--only') + 1]
  : undefined;
if (ONLY !== undefined && ONLY !== 'queued' && ONLY !== 'bare')
  throw new Error(`--only takes queued or bare (got ${JSON.stringify(ONLY)})`);

/** CPU time (user + system) of a process so far, in ms (`/proc` counts in 1/100 s). */
function cpuMs(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(') ') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) * 10;
}

/** Write syscalls (write, writev, …) a process has made so far, and the bytes they wrote. */
function writes(pid: number): { calls: number; bytes: number } {
  const io = readFileSync(`/proc/${pid}/io`, 'utf8');
  return {
    calls: Number(/^syscw: (\d+)$/m.exec(io)?.[1]),
    bytes: Number(/^wchar: (\d+)$/m.exec(io)?.[1]),
  };
}

/** The redis-server behind REDIS_URL: the one listening on its port. */
function redisServerPid(): number {
  const port = new URL(REDIS_URL).port || '6379';
  const found = execFileSync('pgrep', ['-f', `redis-server .*:${port}`], { encoding: 'utf8' })
    .trim()
    .split('\n')
    .map(Number)
    .find((pid) => pid > 0);
  if (found === undefined) throw new Error(`no redis-server on port ${port} to measure`);
  return found;
}

const tag = randomBytes(4).toString('hex');
const QUEUE_PREFIX = `{vc-qcpu-${tag}}`;
const CACHE_PREFIX = `vc-qcpu:${tag}:`;
const redisPid = redisServerPid();
const postgres = await benchPostgres();
const database = `vc_queue_cpu_${tag}`;
await postgres.createDatabase(database);
const pool = new pg.Pool({ connectionString: postgres.url(database), max: 2 });
await migrateQueue(pool);
await pool.end();

const worker = await startQueueWorker(
  {
    databaseUrl: postgres.url(database),
    redisUrl: REDIS_URL,
    queuePrefix: QUEUE_PREFIX,
    cachePrefix: CACHE_PREFIX,
    concurrency: CALLERS,
  },
  process.env['VC_QUEUE_CPU_WORKER_ARGS'],
);

const redis = new Redis(REDIS_URL, { maxRetriesPerRequest: null });
redis.on('error', () => {});
const { local, queue } = await benchQueueExecutor(redis, QUEUE_PREFIX);
const store = new RedisCacheStore({ redis: REDIS_URL, prefix: CACHE_PREFIX, commandTimeout: 5000 });
const queued = withResultCache(queue, { store, seal: { secretKey: QUEUE_BENCH_SECRET } });
let misses = 0;
const miss = () =>
  queued.run(
    local.createJob({
      workspace: 'bench',
      path: 'work',
      runAs: 'pub@example.com',
      origin: { kind: 'app', session: { email: 'bench@example.com' } },
      args: { cpu: misses++ },
    }),
  );

const bare = await bareRoundTrips(redis, QUEUE_PREFIX);
const bareTrip = () => bare.trip('work');

async function round(label: string, op: () => Promise<unknown>): Promise<void> {
  const self0 = process.cpuUsage();
  const worker0 = cpuMs(worker.pid!);
  const workerWrites0 = writes(worker.pid!);
  const ownWrites0 = writes(process.pid);
  const redis0 = cpuMs(redisPid);
  const t0 = performance.now();
  let started = 0;
  await Promise.all(
    Array.from({ length: CALLERS }, async () => {
      while (started++ < MISSES) await op();
    }),
  );
  const wallMs = performance.now() - t0;
  const self = process.cpuUsage(self0);
  const perMiss = (ms: number) => `${Math.round((ms / MISSES) * 1000)} µs`;
  const writesPerMiss = (pid: number, from: { calls: number; bytes: number }) => {
    const now = writes(pid);
    const calls = (now.calls - from.calls) / MISSES;
    return `${calls.toFixed(2)} / ${Math.round((now.bytes - from.bytes) / MISSES)} B`;
  };
  process.stdout.write(
    `| ${label} | ${Math.round(MISSES / (wallMs / 1000))}/s | ${perMiss((self.user + self.system) / 1000)} | ` +
      `${perMiss(cpuMs(worker.pid!) - worker0)} | ${perMiss(cpuMs(redisPid) - redis0)} | ` +
      `${writesPerMiss(worker.pid!, workerWrites0)} | ${writesPerMiss(process.pid, ownWrites0)} |\n`,
  );
}

try {
  for (let i = 0; i < 50; i++) {
    await miss();
    await bareTrip();
  }
  process.stdout.write(
    `**CPU per miss by process** (\`bench/queue_cpu.ts\`: 1 worker process, ${CALLERS} callers, ${MISSES} per round)\n\n` +
      "| round | rate | this process | worker | redis-server | worker's writes | this process's writes |\n" +
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n',
  );
  for (let r = 1; r <= ROUNDS; r++) {
    if (ONLY !== 'bare') await round(`queued misses, ${r}`, miss);
    if (ONLY !== 'queued') await round(`bare BullMQ + the same work, ${r}`, bareTrip);
  }
} finally {
  await stopQueueWorker(worker);
  // Everything this run wrote, the queues' keys included, on a connection of its own.
  const cleaner = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  await deleteKeys(cleaner, `${QUEUE_PREFIX}*`);
  await deleteKeys(cleaner, `${CACHE_PREFIX}*`);
  cleaner.disconnect();
  await bare.close();
  await queue.close();
  await store.close();
  redis.disconnect();
  await postgres.close('vc_queue_cpu_');
}
