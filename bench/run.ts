/**
 * `npm run bench`: every scenario in one run, on the Redis at REDIS_URL, then the tables into
 * docs/benchmarks.md (between the bench markers), bench/README.md and
 * bench/results/latest.json, and (a full run only) README.md's table of targets between its
 * summary markers (`readme_summary.ts`). What is measured lives in one file per scenario; how rows are judged
 * and drawn, in `report.ts`.
 *
 * Flags (after `npm run bench --`):
 * - `--quick`   fewer rounds, for trying a change (tables are still written unless --no-write);
 * - `--no-write` print only;
 * - `--only=a,b` keep only these scenario ids (baselines are always kept); implies --no-write.
 *   Sections none of whose ids are named (Postgres, scaling, execution) are skipped;
 *   `polyglot_miss` is the Python and DuckDB warm misses and hits (bench/polyglot_miss.ts).
 *
 * The execution rows (`queue_bench.ts`, `agent_bench.ts`: a miss through the queue or on an
 * agent worker vs in process) run last, each in a process of its own with its worker processes.
 */
import { mkdir, writeFile } from 'node:fs/promises';
import { loadavg } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { type ChurnRow, churnBench, churnTable } from './churn_bench.js';
import { type DatatableRow, datatableBench } from './datatable_bench.js';
import { type ExecutionRow, executionBenchAlone, executionTable } from './execution_report.js';
import {
  deleteRunKeys,
  rawRedis,
  redisServerPid,
  type ScenarioSet,
  sharedRedis,
  sizeFixture,
} from './fixtures.js';
import {
  type LatencyPlan,
  measureLatency,
  measureThroughput,
  type Scenario,
  type ThroughputPlan,
  wholePeriods,
} from './helpers.js';
import { httpBenchAlone } from './http_bench.js';
import { keyDerivation } from './key_derivation.js';
import { memoryHit } from './memory_hit.js';
import { type MemoryPerEntry, memoryPerEntry, memoryPerEntryTable } from './memory_per_entry.js';
import { memoryScaling } from './memory_scaling.js';
import {
  benchAlone,
  type OutsiderHttp,
  outsiderHttpTable,
  type QueueWork,
  queueWorkTable,
} from './outsider_report.js';
import { peerHit } from './peer_hit.js';
import { type PolyglotResult, polyglotMiss, polyglotTable } from './polyglot_miss.js';
import { benchPostgres } from './postgres_fixture.js';
import { embeddedVersion, writeBenchReadme, writeGuideSection } from './readme.js';
import { readmeSummary, writeReadmeSummary } from './readme_summary.js';
import { redisHit } from './redis_hit.js';
import { redisRawGet } from './redis_raw_get.js';
import {
  CONCURRENCY,
  datatableTable,
  environment,
  envLine,
  type HttpRow,
  httpTable,
  judge,
  latencyRows,
  type Row,
  tables,
  throughputRows,
} from './report.js';
import { sealedFloor } from './sealed_floor.js';
import { twoTierHit } from './two_tier_hit.js';
import { type ValueHitPlan, valueHitTable } from './value_hit.js';

const BENCH_DIR = dirname(fileURLToPath(import.meta.url));
const SIZES = [1024, 64 * 1024];

const argv = process.argv.slice(2);
const quick = argv.includes('--quick');
const only = argv
  .find((a) => a.startsWith('--only='))
  ?.slice('--only='.length)
  .split(',');
const write = !argv.includes('--no-write') && only === undefined;
const BASELINES = new Set([
  'redis_raw_get',
  'redis_keyed_get',
  'sealed_floor',
  'key_naive',
  'bento_memory_hit',
  'map_get_parse',
  'bento_memory_ref_value_hit',
]);
const keep = (s: Pick<Scenario, 'id'>) =>
  only === undefined || BASELINES.has(s.id) || only.includes(s.id);
const wanted = (re: RegExp) => only === undefined || only.some((id) => re.test(id));

const latencyPlan: LatencyPlan = quick
  ? { warmupMs: 100, rounds: 60, roundMs: 3, minOpsPerRound: 3 }
  : { warmupMs: 500, rounds: 300, roundMs: 3, minOpsPerRound: 3 };
/** The Redis rows' plans: the local Redis server's CPU is the measured work's, not another's. */
const withOurs = <P extends LatencyPlan | ThroughputPlan>(plan: P, ours: number | null): P => ({
  ...plan,
  quiet: { ...plan.quiet, ours: ours === null ? [] : [ours] },
});
const keyPlan: LatencyPlan = quick
  ? { warmupMs: 100, rounds: 10, roundMs: 20, minOpsPerRound: 100 }
  : { warmupMs: 300, rounds: 40, roundMs: 25, minOpsPerRound: 100 };
/**
 * Scenarios with a database round trip: slower ops, so fewer per round. PostgreSQL's backends do
 * the measured work, so no block is dropped for others' CPU (`maxOther: 1`).
 */
const dbPlan: LatencyPlan = quick
  ? { warmupMs: 200, rounds: 10, roundMs: 30, minOpsPerRound: 5, quiet: { maxOther: 1 } }
  : { warmupMs: 500, rounds: 40, roundMs: 40, minOpsPerRound: 10, quiet: { maxOther: 1 } };
/**
 * Short rounds, many of them: at 64 KiB the Redis round trip flips between two speeds for
 * seconds at a time (see `sharedRedis`), and only fine interleaving spreads that evenly.
 * With `scenarios` (how many share the rounds), whole periods of their Williams design
 * (`roundOrder`), so that every scenario follows every other equally often: 13 scenarios and
 * 40 rounds were a period and a half. At 64 KiB four periods (104 rounds for 13): with 40, one
 * block of rounds held 4 of each scenario's, and a block's ratio ranged 0.5–1.6× between
 * blocks of one run (a GC of 64 KiB buffers landing in one scenario's 30 ms round).
 */
const throughputPlan = (bytes: number, scenarios?: number): ThroughputPlan => {
  const rounds = quick ? 6 : bytes > 4096 ? 100 : 30;
  return {
    concurrency: CONCURRENCY,
    opsPerRound: bytes > 4096 ? CONCURRENCY * 5 : CONCURRENCY * 20,
    warmupRounds: quick ? 1 : 3,
    rounds: scenarios === undefined || quick ? rounds : wholePeriods(scenarios, rounds),
  };
};

const elapsed = (started: number) => `${((Date.now() - started) / 1000).toFixed(0)} s`;

async function closeAll(sets: readonly ScenarioSet[]): Promise<void> {
  for (const set of sets) await set.close();
}

async function main(): Promise<void> {
  const env = await environment();
  console.log(`viewer-cache bench · ${envLine(env)} · ${quick ? 'quick' : 'full'} run`);
  const rows: Row[] = [];
  const started = Date.now();

  for (const bytes of SIZES) {
    const fx = sizeFixture(bytes);
    process.stdout.write(`\n${fx.label}: filling… `);
    // redis_hit first: the raw baseline reads the entries it wrote.
    const redis = sharedRedis();
    const redisPid = await redisServerPid(redis);
    const sets = [
      await redisHit(fx, redis),
      await redisRawGet(fx, redis),
      await sealedFloor(fx, redis),
      await memoryHit(fx),
      await peerHit(fx, redis),
      await twoTierHit(fx, redis),
    ];
    const scenarios = sets.flatMap((s) => s.scenarios).filter(keep);
    process.stdout.write('latency… ');
    const latency = await measureLatency(scenarios, withOurs(latencyPlan, redisPid));
    rows.push(...latencyRows(fx.label, scenarios, latency, 'redis_raw_get'));
    process.stdout.write(`${CONCURRENCY} callers… `);
    const throughput = await measureThroughput(
      scenarios,
      withOurs(throughputPlan(bytes, scenarios.length), redisPid),
    );
    rows.push(...throughputRows(fx.label, scenarios, throughput, 'redis_raw_get'));
    await closeAll(sets);
    redis.disconnect();
    process.stdout.write(`done (${elapsed(started)})`);
  }

  process.stdout.write('\nkey derivation… ');
  const keySet = await keyDerivation(sizeFixture(1024));
  const keyScenarios = keySet.scenarios.filter(keep);
  const keyStats = await measureLatency(keyScenarios, keyPlan);
  rows.push(...latencyRows('—', keyScenarios, keyStats, 'key_naive'));
  await keySet.close();
  process.stdout.write(`done (${elapsed(started)})`);

  // Hits returning the value, against their own floor: a table of their own, from a process of
  // its own (in this one, after the Redis sections, the hit read ~5 % slower: see value_hit.ts).
  let valueRows: Row[] = [];
  if (wanted(/^(value_hit|result_cache_value_hit|bento_memory_ref_value_hit)/)) {
    process.stdout.write('\nvalue hits… ');
    const plan: ValueHitPlan = { latency: latencyPlan, throughput: throughputPlan(1024) };
    const measured = await benchAlone<{ rows: Row[] }>('value_hit.ts', [
      '--plan',
      JSON.stringify(plan),
    ]);
    valueRows = measured.rows.filter((r) => keep({ id: r.id }));
    process.stdout.write(`done (${elapsed(started)})`);
  }

  // Bytes, not time: each measurement in a process of its own.
  let memoryRows: MemoryPerEntry | undefined;
  if (wanted(/^memory_per_entry/)) {
    process.stdout.write('\nmemory per entry… ');
    memoryRows = await memoryPerEntry(quick);
    process.stdout.write(`done (${elapsed(started)})`);
  }

  if (wanted(/^scale_/)) {
    process.stdout.write('\nscaling: filling 1 M entries… ');
    const scaling = await memoryScaling(quick ? 200_000 : 1_000_000);
    process.stdout.write('latency… ');
    const stats = await measureLatency(scaling.scenarios, keyPlan);
    for (const small of ['scale_memory_hit_1k', 'scale_lru_get_1k']) {
      const pair = scaling.scenarios.filter((s) => s.id.startsWith(small.slice(0, -2)));
      rows.push(...latencyRows('—', pair, stats, small));
    }
    await scaling.close();
    process.stdout.write(`done (${elapsed(started)})`);
  }

  // Data tables and HTTP: on a real Postgres (DATABASE_URL, else embedded).
  let datatableRows: DatatableRow[] = [];
  let httpRows: HttpRow[] = [];
  let churnRows: ChurnRow[] = [];
  let polyglot: PolyglotResult | undefined;
  let executionRows: ExecutionRow[] = [];
  let outsider: OutsiderHttp | undefined;
  let queueWork: QueueWork | undefined;
  if (
    wanted(
      /^(pg_|datatable_|memory_hit_plain|memory_hit_fingerprinted|set_login_|http_|churn_|steady_|polyglot_)/,
    )
  ) {
    const pgPrefix = `vcb${process.pid}_`;
    process.stdout.write('\npostgres… ');
    const postgres = await benchPostgres();
    try {
      env.postgres = `${postgres.version}; embedded for \`npm start\`: ${await embeddedVersion()}`;
      // With --only, a part of this section none of whose ids is named is skipped.
      const older = wanted(
        /^(pg_|datatable_|memory_hit_plain|memory_hit_fingerprinted|set_login_|http_|churn_|steady_)/,
      );
      if (older) {
        process.stdout.write('data tables… ');
        datatableRows = await datatableBench(postgres, pgPrefix, dbPlan, quick ? 8 : 30);
      }
      if (wanted(/^polyglot_/)) {
        process.stdout.write('python and duckdb… ');
        polyglot = await polyglotMiss(postgres, pgPrefix, quick ? 10 : 40);
      }
      if (older) {
        process.stdout.write('churn… ');
        churnRows = await churnBench(postgres, pgPrefix, quick ? 5 : 20, quick ? 500 : 2000);
        process.stdout.write('http… ');
        httpRows = await httpBenchAlone(postgres.url('postgres'), quick);
        // The same hit as an outsider measures it: autocannon, quiet rounds only.
        process.stdout.write('http (autocannon)… ');
        outsider = await benchAlone<OutsiderHttp>('outsider_http.ts', [
          '--rounds',
          quick ? '3' : '8',
          '--seconds',
          quick ? '2' : '4',
        ]);
      }
    } finally {
      await postgres.close(pgPrefix);
    }
  }
  // Execution: each in a process of its own, with its worker processes; on the
  // run's Postgres (DATABASE_URL, else an embedded one of their own).
  if (wanted(/^(queue_|agent_)/)) {
    process.stdout.write('\nexecution: ');
    if (wanted(/^queue_/))
      executionRows.push(...(await executionBenchAlone('queue_bench.ts', quick)));
    if (wanted(/^agent_/))
      executionRows.push(...(await executionBenchAlone('agent_bench.ts', quick)));
    if (wanted(/^queue_/)) {
      process.stdout.write('queue work… ');
      queueWork = await benchAlone<QueueWork>('queue_miss_work.ts', []);
    }
    if (only !== undefined) executionRows = executionRows.filter((r) => only.includes(r.id));
  }
  console.log(`done (${elapsed(started)})\n`);

  env.load += ` → ${loadavg()[0]!.toFixed(2)}`;
  judge(rows);
  const body = [
    tables(rows),
    ...(valueRows.length > 0 ? [valueHitTable(valueRows)] : []),
    ...(memoryRows === undefined ? [] : [memoryPerEntryTable(memoryRows)]),
    ...(datatableRows.length > 0 ? [datatableTable(datatableRows)] : []),
    ...(churnRows.length > 0 ? [churnTable(churnRows)] : []),
    ...(polyglot === undefined ? [] : [polyglotTable(polyglot)]),
    ...(httpRows.length > 0 ? [httpTable(httpRows)] : []),
    ...(outsider === undefined ? [] : [outsiderHttpTable(outsider)]),
    ...(executionRows.length > 0 ? [executionTable(executionRows)] : []),
    ...(queueWork === undefined ? [] : [queueWorkTable(queueWork)]),
  ].join('\n\n');
  console.log(body);
  // A hit that started a python3 process or a DuckDB instance fails the run (the hit path).
  if (
    polyglot !== undefined &&
    polyglot.startedByHits.spawns + polyglot.startedByHits.instances > 0
  )
    process.exitCode = 1;

  const cleanup = rawRedis();
  await deleteRunKeys(cleanup);
  cleanup.disconnect();

  if (!write) return;
  await mkdir(join(BENCH_DIR, 'results'), { recursive: true });
  await writeFile(
    join(BENCH_DIR, 'results', 'latest.json'),
    `${JSON.stringify({ env, plan: { latencyPlan, keyPlan, dbPlan, quick }, rows, valueRows, memoryRows, datatableRows, churnRows, polyglot, httpRows, outsider, executionRows, queueWork }, null, 2)}\n`,
  );
  await writeGuideSection(
    `Measured by \`npm run bench\` on ${envLine(env)}. How, and what each row is: ` +
      `[bench/README.md](../bench/README.md).\n\n${body}`,
  );
  await writeBenchReadme(env, body);
  // README.md's table only from a whole run: a partial one would mix two runs' figures.
  const summarized =
    !quick &&
    (await writeReadmeSummary(
      readmeSummary({
        env,
        rows,
        valueRows,
        memory: memoryRows,
        datatable: datatableRows,
        outsider,
        execution: executionRows,
        queueWork,
        churn: churnRows,
      }),
    ));
  console.log(
    `\nwrote docs/benchmarks.md, bench/README.md, bench/results/latest.json${summarized ? ', README.md' : ''}`,
  );
}

main().catch(async (err: unknown) => {
  console.error('\nbench failed:', err);
  const cleanup = rawRedis();
  await deleteRunKeys(cleanup).catch(() => {});
  cleanup.disconnect();
  process.exit(1);
});
