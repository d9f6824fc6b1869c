/**
 * `VC_BASE_SRC=/path/to/other/src npx tsx bench/hit_ab.ts [--quick] [--bytes 1024]`: the
 * library's hits from two builds in one process, interleaved in the same rounds as their
 * floors, so that "before" and "after" meet the same noise. `VC_BASE_SRC` is the `src/` of the
 * build to compare against (e.g. `git archive <commit> src | tar -x -C /tmp/base`); this tree's
 * `src/` is "after".
 *
 * Rows, 1 KiB unless `--bytes` says otherwise, one caller (p50) and 64 callers (ops/s):
 * - floors: `map_get_parse` (Map.get + JSON.parse), `redis_raw_get`, `sealed_floor`;
 * - per build: `value_hit` (`createViewerCache(...).run`, memory store, `result.value`),
 *   `redis_hit` and `redis_hit_sealed` (`withResultCache` over `RedisCacheStore`, `json()`);
 * - this build only: `value_hit_shared` (`values: 'shared'`).
 *
 * The two builds' rows are not quite alike: at 64 KiB and 64 callers the unsealed "after" row
 * read 0.02–0.07 below "before" whichever build was "after" (66 rounds, 2026-12-07, builds
 * swapped by running this file from the other tree). Before believing a difference of that
 * size there, swap the builds.
 *
 * Needs Redis at `REDIS_URL`; writes under `vc-bench:<pid>:` and deletes it at the end.
 */
import {
  deleteRunKeys,
  GuardedExecutor,
  RUN_PREFIX,
  redisServerPid,
  sharedRedis,
  sizeFixture,
  TTL_S,
} from './fixtures.js';
import {
  BenchInvariantError,
  fmt,
  markdownTable,
  measureLatency,
  measureThroughput,
  type Scenario,
} from './helpers.js';
import { redisHit } from './redis_hit.js';
import { redisRawGet } from './redis_raw_get.js';
import { sealedFloor } from './sealed_floor.js';

type Lib = typeof import('../src/index.js');

const base = process.env['VC_BASE_SRC'];
if (base === undefined) throw new Error('set VC_BASE_SRC to the src/ directory of the other build');
const quick = process.argv.includes('--quick');
const before = (await import(`${base.replace(/\/$/, '')}/index.ts`)) as Lib;
const after = (await import('../src/index.js')) as Lib;

const bytesAt = process.argv.indexOf('--bytes');
const fx = sizeFixture(bytesAt === -1 ? 1024 : Number(process.argv[bytesAt + 1]));
const redis = sharedRedis();
const redisPid = await redisServerPid(redis);
/** The local Redis server's CPU is the measured work's: not counted as others'. */
const quiet = { ours: redisPid === null ? [] : [redisPid] };
const SECRET = 'bench-only secret, 32 bytes or more, not for use';
const n = fx.jobs.length;
const rows = (JSON.parse(fx.text) as { rows: unknown[] }).rows.length;

async function libRows(lib: Lib, tag: string, shared: boolean): Promise<Scenario[]> {
  const value: unknown = JSON.parse(fx.text);
  const runs = fx.jobs.map((job) => ({
    path: job.runnable.path,
    args: job.args as Record<string, unknown>,
    origin: { kind: 'app' as const, session: { email: job.perms.endUserEmail! } },
  }));
  const viewerCache = (values?: 'shared') =>
    lib.createViewerCache({
      functions: { [fx.jobs[0]!.runnable.path]: () => value },
      store: new lib.MemoryCacheStore({ maxBytes: 64 << 20 }),
      ttl: `${TTL_S}s`,
      workspace: fx.jobs[0]!.workspace,
      ...(values ? ({ values } as object) : {}),
    });
  const fresh = viewerCache();
  for (const run of runs) await fresh.run(run);
  const executor = new GuardedExecutor(`redis_${tag}`, fx.json);
  const store = new lib.RedisCacheStore({
    redis,
    prefix: `${RUN_PREFIX}${tag}:`,
    commandTimeout: '2s',
  });
  const plain = lib.withResultCache(executor, { store, seal: false });
  const sealedStore = new lib.RedisCacheStore({
    redis,
    prefix: `${RUN_PREFIX}${tag}-sealed:`,
    commandTimeout: '2s',
  });
  const sealed = lib.withResultCache(executor, {
    store: sealedStore,
    seal: { secretKey: SECRET },
  });
  for (const job of fx.jobs) {
    await plain.run(job);
    await sealed.run(job);
  }
  executor.arm();
  const valueRow = (id: string, cache: ReturnType<typeof viewerCache>): Scenario => ({
    id,
    label: id,
    async: true,
    op: async (i: number) => {
      const result = await cache.run(runs[i % n]!);
      const got = result.value as { rows?: unknown[] };
      if (!result.fromCache || got.rows?.length !== rows) {
        throw new BenchInvariantError(`${id}: not a hit of the stored value`);
      }
    },
  });
  const bytesRow = (id: string, cache: typeof plain): Scenario => ({
    id,
    label: id,
    async: true,
    op: async (i: number) => {
      const result = await cache.run(fx.jobs[i % n]!);
      if (!result.fromCache || result.json().byteLength !== fx.bytes) {
        throw new BenchInvariantError(`${id}: not a hit of the stored bytes`);
      }
    },
  });
  const out = [
    valueRow(`value_hit ${tag}`, fresh),
    bytesRow(`redis_hit ${tag}`, plain),
    bytesRow(`redis_hit_sealed ${tag}`, sealed),
  ];
  if (shared) {
    const frozen = viewerCache('shared');
    for (const run of runs) await frozen.run(run);
    out.push(valueRow(`value_hit_shared ${tag}`, frozen));
  }
  return out;
}

const map = new Map(fx.keys.map((key) => [key, fx.text]));
await redisHit(fx, redis); // fills the entries the raw GET reads
const floors: Scenario[] = [
  {
    id: 'map_get_parse',
    label: 'map_get_parse',
    async: false,
    op: (i: number) => JSON.parse(map.get(fx.keys[i % n]!)!),
  },
  ...(await redisRawGet(fx, redis)).scenarios,
  ...(await sealedFloor(fx, redis)).scenarios,
];
const scenarios = [
  ...floors,
  ...(await libRows(before, 'before', false)),
  ...(await libRows(after, 'after', true)),
];

const floorOf = (id: string) =>
  id.startsWith('value_hit')
    ? 'map_get_parse'
    : id.startsWith('redis_hit_sealed')
      ? 'sealed_floor'
      : 'redis_raw_get';

const latency = await measureLatency(scenarios, {
  warmupMs: 300,
  rounds: quick ? 40 : 150,
  roundMs: 4,
  minOpsPerRound: 3,
  quiet,
});
const throughput = await measureThroughput(scenarios, {
  concurrency: 64,
  opsPerRound: 64 * 20,
  warmupRounds: 2,
  rounds: quick ? 6 : 20,
  quiet,
});
const table = markdownTable(
  ['scenario', 'floor', 'p50 µs', 'p50 × floor', 'c64 ops/s', 'c64 ops/s × floor'],
  scenarios.map((s) => {
    const l = latency.get(s.id)!;
    const t = throughput.get(s.id)!;
    const floor = floorOf(s.id);
    const isFloor = floors.some((f) => f.id === s.id);
    return [
      `\`${s.id}\``,
      isFloor ? '' : `\`${floor}\``,
      fmt(l.p50Us, 2),
      isFloor ? '' : fmt(l.p50Us / latency.get(floor)!.p50Us, 2),
      fmt(t.opsPerSec, 0),
      isFloor ? '' : fmt(t.opsPerSec / throughput.get(floor)!.opsPerSec, 2),
    ];
  }),
);
console.log(table);
await deleteRunKeys(redis);
redis.disconnect();
