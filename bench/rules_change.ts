/**
 * Rule changes (SPEC invariant 22): how soon an `ALTER POLICY` made behind the library — by a
 * plain superuser connection, in the data table's database — reaches the next run of another
 * process, in both modes; and what the rules version costs a hit.
 *
 * Propagation: two reference servers (child processes) on one database and one Redis, the
 * demo's alice reading `f/orders/list` (cached). Each change tightens the demo's `orders_emea`
 * policy to `false` or restores it; the figure is the time from the DDL's commit (the statement
 * returning to its caller) to the start of the first run reflecting it, on the slower server
 * (test/helpers/propagation.ts). First with the event trigger (catalog migration 7, installed as
 * a superuser), then with it dropped, as on a managed Postgres: the servers fall back to the
 * digest of the rules read every heartbeat (bound heartbeat + timeout, 2000 ms by default).
 *
 * Hit path: a MemoryCacheStore hit with `fingerprint: datatables.fingerprint` beside the same
 * hit without a fingerprint, in the same run (as bench/datatable_bench.ts), on a data table in
 * each mode: the rules version is held in the catalog state, so the hit gains no round trip.
 *
 * Standalone: `npx tsx bench/rules_change.ts [--trials 20] [--bound 2000] [--no-fleet]`
 * (DATABASE_URL or an embedded PostgreSQL; REDIS_URL or 127.0.0.1:6379). Not part of
 * `npm run bench`: it spawns two servers.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import pg from 'pg';
import {
  createDatatables,
  type Datatables,
  type Job,
  MemoryCacheStore,
  withResultCache,
} from '../src/index.js';
import { type ChangeSample, percentile, propagationScene } from '../test/helpers/propagation.js';
import { ServerFleet } from '../test/helpers/server_fleet.js';
import { clearRedisPrefix } from '../test/helpers/server_process.js';
import {
  BenchInvariantError,
  fmt,
  type LatencyPlan,
  markdownTable,
  measureLatency,
} from './helpers.js';
import { type BenchPostgres, benchPostgres } from './postgres_fixture.js';

type Mode = 'event-trigger' | 'digest';

export interface RulesPropagationRow {
  readonly mode: Mode;
  readonly changes: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  /** Runs that started `boundMs` after the commit, or after one reflected it, still old. */
  readonly staleAfterBound: number;
}

/** Two servers; `trials` changes of each direction in each mode. */
export async function rulesPropagation(
  postgres: BenchPostgres,
  options: { trials: number; boundMs: number },
): Promise<RulesPropagationRow[]> {
  const prefix = `vcr${process.pid}_`;
  const database = `${prefix}rules`;
  const secretKey = randomBytes(32).toString('hex');
  const redisUrl = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
  const redisPrefix = `vc-bench-rules:${process.pid}:`;
  let fleet: ServerFleet | undefined;
  try {
    await postgres.createDatabase(database);
    const databaseUrl = postgres.url(database);
    fleet = await ServerFleet.start({
      databaseUrl,
      prefix,
      secretKey,
      redisUrl,
      redisPrefix,
      count: 2,
      // The servers say when they fall back to the digest (a warning).
      env: { LOG_LEVEL: 'info' },
    });
    const scene = await propagationScene(fleet, { databaseUrl, prefix, secretKey });
    const rows: RulesPropagationRow[] = [];
    try {
      for (const mode of ['event-trigger', 'digest'] as const) {
        if (mode === 'digest') {
          await scene.sql.query('drop event trigger viewer_cache_rules_ddl');
          await scene.sql.query('drop event trigger viewer_cache_rules_drop');
          await waitForDigest(fleet);
        }
        const samples: ChangeSample[] = [];
        for (let trial = 0; trial < options.trials; trial++) {
          for (const direction of ['revoke', 'restore'] as const)
            samples.push(await scene.measure('policy', direction, options.boundMs));
          process.stderr.write(`\r${mode}: trial ${trial + 1}/${options.trials}`);
        }
        process.stderr.write('\n');
        const latencies = samples.map((s) => s.latencyMs);
        rows.push({
          mode,
          changes: samples.length,
          p50Ms: percentile(latencies, 50),
          p99Ms: percentile(latencies, 99),
          maxMs: Math.max(...latencies),
          staleAfterBound: samples.reduce((total, s) => total + s.staleAfterBound, 0),
        });
      }
    } finally {
      await scene.close();
    }
    return rows;
  } finally {
    await fleet?.stop();
    const redis = new Redis(redisUrl, { lazyConnect: true });
    redis.on('error', () => {});
    await clearRedisPrefix(redis, redisPrefix).catch(() => {});
    redis.disconnect();
    await postgres.close(prefix);
  }
}

/** Until every server said its data table runs on the digest (within a deadline). */
async function waitForDigest(fleet: ServerFleet): Promise<void> {
  const deadline = performance.now() + 30_000;
  const said = (lines: readonly string[]) => lines.some((line) => line.includes('"mode":"digest"'));
  while (!fleet.servers.every((server) => said(server.lines))) {
    if (performance.now() > deadline) throw new Error('the servers never fell back to the digest');
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

export interface RulesHitRow {
  readonly mode: Mode;
  readonly plainP50Us: number;
  readonly fingerprintedP50Us: number;
  /** Fingerprinted p50 − plain p50, µs (same run). */
  readonly addedUs: number;
}

// PostgreSQL's own work is part of what is measured here: no block is dropped for it.
const plan: LatencyPlan = {
  warmupMs: 500,
  rounds: 40,
  roundMs: 40,
  minOpsPerRound: 10,
  quiet: { maxOther: 1 },
};

/** A hit with and without the fingerprint, on a data table in each mode (same run). */
export async function rulesHitPath(postgres: BenchPostgres): Promise<RulesHitRow[]> {
  const prefix = `vch${process.pid}_`;
  const rows: RulesHitRow[] = [];
  try {
    for (const mode of ['event-trigger', 'digest'] as const) {
      const database = `${prefix}${mode === 'digest' ? 'digest' : 'trigger'}`;
      await postgres.createDatabase(database);
      const url = postgres.url(database);
      const datatables = await createDatatables({
        connection: url,
        secretKey: 'bench-secret-key-0123456789abcdef-0123456789',
        pools: { prepareAhead: false },
      });
      try {
        if (mode === 'digest') {
          const sql = new pg.Client({ connectionString: url });
          await sql.connect();
          await sql.query('drop event trigger viewer_cache_rules_ddl');
          await sql.query('drop event trigger viewer_cache_rules_drop');
          await sql.end();
        }
        await datatables.admin.createDatatable('bench', 'main', { database });
        await datatables.admin.createRole('bench', 'main', `${prefix}${mode[0]}_reader`, {
          tenants: ['*'],
        });
        await waitForMode(datatables, mode);
        rows.push({ mode, ...(await hits(datatables)) });
      } finally {
        await datatables.close();
      }
    }
  } finally {
    await postgres.close(prefix);
  }
  return rows;
}

async function waitForMode(datatables: Datatables, mode: Mode): Promise<void> {
  const deadline = performance.now() + 10_000;
  while (datatables.rulesMode('bench', 'main') !== mode) {
    if (performance.now() > deadline) throw new Error(`the data table never ran in ${mode} mode`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function hits(
  datatables: Datatables,
): Promise<{ plainP50Us: number; fingerprintedP50Us: number; addedUs: number }> {
  let executions = 0;
  const executor = {
    run: async (job: Job) => {
      executions++;
      const bytes = Buffer.from(JSON.stringify({ rows: [1, 2, 3], viewer: job.id }));
      return { jobId: job.id, value: null, fromCache: false, json: () => bytes };
    },
  };
  const plain = withResultCache(executor, { store: new MemoryCacheStore() });
  const fingerprinted = withResultCache(executor, {
    store: new MemoryCacheStore(),
    fingerprint: datatables.fingerprint,
  });
  const jobs: Job[] = Array.from({ length: 1000 }, (_, v) => ({
    id: 'bench',
    workspace: 'bench',
    runnable: { path: 'orders', hash: 'v1' },
    args: {},
    perms: { email: 'publisher@example.com', endUserEmail: `viewer${v}@example.com` },
    cacheTtlS: 3600,
  }));
  for (const job of jobs) {
    await plain.run(job);
    await fingerprinted.run(job);
  }
  const filled = executions;
  const hit = (cache: typeof plain) => async (i: number) => {
    const result = await cache.run(jobs[i % jobs.length]!);
    if (!result.fromCache) throw new BenchInvariantError('a "hit" executed');
  };
  const stats = await measureLatency(
    [
      { id: 'plain', label: 'plain', async: true, op: hit(plain) },
      {
        id: 'fingerprinted',
        label: 'fingerprinted',
        async: true,
        op: hit(fingerprinted),
        verify: () => {
          if (executions !== filled) throw new BenchInvariantError('a hit executed');
        },
      },
    ],
    plan,
  );
  const plainP50Us = stats.get('plain')!.p50Us;
  const fingerprintedP50Us = stats.get('fingerprinted')!.p50Us;
  return { plainP50Us, fingerprintedP50Us, addedUs: fingerprintedP50Us - plainP50Us };
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const value = (flag: string, fallback: number) => {
    const at = args.indexOf(flag);
    return at < 0 ? fallback : Number(args[at + 1]);
  };
  const trials = value('--trials', 20);
  const boundMs = value('--bound', 2000);
  // Each part drops what it made (and stops an embedded server) when done: one each.
  const hitRows = await rulesHitPath(await benchPostgres());
  console.log('Hit path (MemoryCacheStore, 1000 viewers; same run):\n');
  console.log(
    markdownTable(
      ['mode', 'hit p50 µs, no fingerprint', 'hit p50 µs, fingerprinted', 'added µs'],
      hitRows.map((r) => [
        r.mode,
        fmt(r.plainP50Us, 2),
        fmt(r.fingerprintedP50Us, 2),
        fmt(r.addedUs, 2),
      ]),
    ),
  );
  if (!args.includes('--no-fleet')) {
    const rows = await rulesPropagation(await benchPostgres(), { trials, boundMs });
    console.log(
      `\nALTER POLICY by a plain connection → first run reflecting it on the slower of 2 servers, ${trials} trials per direction:\n`,
    );
    console.log(
      markdownTable(
        ['mode', 'changes', 'p50 ms', 'p99 ms', 'max ms', `old after ${boundMs} ms`],
        rows.map((r) => [
          r.mode,
          String(r.changes),
          fmt(r.p50Ms),
          fmt(r.p99Ms),
          fmt(r.maxMs),
          String(r.staleAfterBound),
        ]),
      ),
    );
  }
}
