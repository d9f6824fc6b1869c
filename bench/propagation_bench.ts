/**
 * Revocation propagation across processes: how soon a change reaches every process's next run.
 * Three reference servers (child processes) on one database and one Redis — or, with
 * `--cluster`, a private 3-master Redis Cluster — and an admin process of their own. For each kind of change (role disabled/enabled,
 * membership removed/added, tenants cleared/restored, entitlement row deleted/inserted by a plain
 * connection), the time from the change returning to its caller until every server's next run
 * reflects it: each server is asked for the viewer's rows back to back, and its first reflecting
 * run's start is its figure; the change's figure is the slowest server's. That is an upper bound:
 * the run before it may have been slow (a miss under load). The lower bound is the start of the
 * latest run that still answered the old state ("latest old run": the NOTIFY had not arrived
 * yet). Also counted: runs that started after the change returned and still answered the old
 * state, and runs still old after `--bound` ms (goal: 0).
 *
 * With `--await`, the admin process waits for every server's acknowledgement before a change
 * returns (`catalog.awaitPropagation`, as the CLI does); the time that adds is reported.
 *
 * Standalone: `npx tsx bench/propagation_bench.ts [--trials 30] [--cluster] [--bound 1000] [--await]`
 * (DATABASE_URL or an embedded PostgreSQL; REDIS_URL or 127.0.0.1:6379; `--cluster` needs
 * `redis-server` and `redis-cli`). Not part of `npm run bench`: it spawns three servers.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import {
  type ChangeKind,
  type ChangeSample,
  type Direction,
  KINDS,
  percentile,
  propagationScene,
} from '../test/helpers/propagation.js';
import { startRedisCluster } from '../test/helpers/redis_cluster.js';
import { ServerFleet } from '../test/helpers/server_fleet.js';
import { clearRedisPrefix } from '../test/helpers/server_process.js';
import { markdownTable } from './helpers.js';
import { benchPostgres } from './postgres_fixture.js';

export interface PropagationRow {
  readonly kind: ChangeKind;
  readonly changes: number;
  /** p50 of how long a change took to return to its caller. */
  readonly changeP50Ms: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  readonly maxMs: number;
  readonly revokeP99Ms: number;
  readonly runsAfterConfirm: number;
  readonly staleAfterConfirm: number;
  /** p99 over changes of the latest start of a run still answering the old state. */
  readonly staleP99Ms: number;
  readonly staleWindowMs: number;
  readonly staleAfterBound: number;
}

export async function propagationBench(options: {
  trials: number;
  cluster: boolean;
  boundMs: number;
  /** The admin process waits for every server's acknowledgement (as the CLI does). */
  awaitPropagation: boolean;
}): Promise<PropagationRow[]> {
  const postgres = await benchPostgres();
  const prefix = `vcp${process.pid}_`;
  const database = `${prefix}propagation`;
  const secretKey = randomBytes(32).toString('hex');
  const redisPrefix = `vc-bench-propagation:${process.pid}:`;
  const cluster = options.cluster ? await startRedisCluster() : null;
  const redisUrl =
    cluster === null
      ? (process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379')
      : cluster.nodes.map((node) => `${node.host}:${node.port}`).join(',');
  let fleet: ServerFleet | undefined;
  try {
    await postgres.createDatabase(database);
    const databaseUrl = postgres.url(database);
    fleet = await ServerFleet.start({ databaseUrl, prefix, secretKey, redisUrl, redisPrefix });
    const scene = await propagationScene(fleet, {
      databaseUrl,
      prefix,
      secretKey,
      awaitPropagation: options.awaitPropagation,
    });
    const samples: ChangeSample[] = [];
    try {
      for (let trial = 0; trial < options.trials; trial++) {
        for (const kind of KINDS) {
          for (const direction of ['revoke', 'restore'] as Direction[]) {
            samples.push(await scene.measure(kind, direction, options.boundMs));
          }
        }
        process.stderr.write(`\rtrial ${trial + 1}/${options.trials}`);
      }
      process.stderr.write('\n');
    } finally {
      await scene.close();
    }
    return KINDS.map((kind) => {
      const mine = samples.filter((s) => s.kind === kind);
      const latencies = mine.map((s) => s.latencyMs);
      const sum = (f: (s: ChangeSample) => number) => mine.reduce((t, s) => t + f(s), 0);
      return {
        kind,
        changes: mine.length,
        changeP50Ms: percentile(
          mine.map((s) => s.changeMs),
          50,
        ),
        p50Ms: percentile(latencies, 50),
        p99Ms: percentile(latencies, 99),
        maxMs: Math.max(...latencies),
        revokeP99Ms: percentile(
          mine.filter((s) => s.direction === 'revoke').map((s) => s.latencyMs),
          99,
        ),
        runsAfterConfirm: sum((s) => s.runs),
        staleAfterConfirm: sum((s) => s.staleAfterConfirm),
        staleP99Ms: percentile(
          mine.map((s) => s.staleWindowMs),
          99,
        ),
        staleWindowMs: Math.max(...mine.map((s) => s.staleWindowMs)),
        staleAfterBound: sum((s) => s.staleAfterBound),
      };
    });
  } finally {
    await fleet?.stop();
    if (cluster !== null) await cluster.stop();
    else {
      const redis = new Redis(redisUrl, { lazyConnect: true });
      redis.on('error', () => {});
      await clearRedisPrefix(redis, redisPrefix).catch(() => {});
      redis.disconnect();
    }
    await postgres.close(prefix);
  }
}

export function propagationTable(rows: readonly PropagationRow[], boundMs: number): string {
  const ms = (value: number) => value.toFixed(1);
  return markdownTable(
    [
      'change',
      'changes',
      'change returns p50 ms',
      'p50 ms',
      'p99 ms',
      'max ms',
      'revoke p99 ms',
      'runs after return',
      'old state after return',
      'latest old run p99 ms',
      'latest old run max ms',
      `old after ${boundMs} ms`,
    ],
    rows.map((row) => [
      row.kind,
      String(row.changes),
      ms(row.changeP50Ms),
      ms(row.p50Ms),
      ms(row.p99Ms),
      ms(row.maxMs),
      ms(row.revokeP99Ms),
      String(row.runsAfterConfirm),
      String(row.staleAfterConfirm),
      ms(row.staleP99Ms),
      ms(row.staleWindowMs),
      String(row.staleAfterBound),
    ]),
  );
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const args = process.argv.slice(2);
  const value = (flag: string, fallback: number) => {
    const at = args.indexOf(flag);
    return at < 0 ? fallback : Number(args[at + 1]);
  };
  const options = {
    trials: value('--trials', 30),
    cluster: args.includes('--cluster'),
    boundMs: value('--bound', 1000),
    awaitPropagation: args.includes('--await'),
  };
  const rows = await propagationBench(options);
  console.log(
    `Propagation across 3 server processes (${options.cluster ? '3-master Redis Cluster' : 'one Redis'}${options.awaitPropagation ? ', admin awaits acknowledgements' : ''}), ${options.trials} trials per kind and direction:\n`,
  );
  console.log(propagationTable(rows, options.boundMs));
  const worst = Math.max(...rows.map((row) => row.p99Ms));
  const late = rows.reduce((total, row) => total + row.staleAfterBound, 0);
  console.log(
    `\nslowest p99 ${worst.toFixed(1)} ms (goal ≤ 1000) · runs still old after ${options.boundMs} ms: ${late} (goal 0)`,
  );
}
