/**
 * Hit ratio under churn (SPEC: ≥ 0.95 × the hit ratio without churn): 10 000 viewers over 50
 * groups, a read mix where a few viewers are much busier than most, and one membership change
 * per second. The same seeded sequence of reads runs twice on warm caches — without changes,
 * then with one change per (simulated) second — and the ratio of the two hit ratios is the
 * figure. Before the fingerprint dropped the catalog generation, every change emptied every
 * viewer's entries, and the ratio was ≈ 0.
 *
 * Standalone: `npx tsx bench/churn_bench.ts` (uses DATABASE_URL or an embedded PostgreSQL).
 */
import pg from 'pg';
import {
  createDatatables,
  type Datatables,
  type Job,
  type JobExecutor,
  MemoryCacheStore,
  withResultCache,
} from '../src/index.js';
import { prng } from './helpers.js';
import { type BenchPostgres, benchPostgres } from './postgres_fixture.js';

const WS = 'churn';
const SECRET = 'bench-secret-key-0123456789abcdef-0123456789';
const VIEWERS = 10_000;
const GROUPS = 50;
const ROLES = 10;

export interface ChurnRow {
  readonly id: string;
  readonly label: string;
  readonly reads: number;
  readonly changes: number;
  readonly hitRatio: number;
}

/** The benchmarks table (docs/benchmarks.md): both hit ratios, and their ratio to SPEC's target. */
export function churnTable(rows: readonly ChurnRow[]): string {
  const [steady, churn] = rows;
  if (steady === undefined || churn === undefined) return '';
  const ratio = churn.hitRatio / steady.hitRatio;
  return [
    '**Hit ratio under churn** (same seeded reads on warm caches, without and with one membership change per second):',
    '',
    '| scenario | reads | changes | hit ratio | × steady | target |',
    '| --- | ---: | ---: | ---: | ---: | --- |',
    `| \`${steady.id}\` — ${steady.label} | ${steady.reads} | 0 | ${steady.hitRatio.toFixed(4)} | 1.00 | |`,
    `| \`${churn.id}\` — ${churn.label} | ${churn.reads} | ${churn.changes} | ${churn.hitRatio.toFixed(4)} | ${ratio.toFixed(3)} | ${ratio >= 0.95 ? '✅' : '❌'} ≥ 0.95× |`,
  ].join('\n');
}

/** Viewer i's email; a skewed pick: a tenth of the viewers get most of the reads. */
const viewer = (i: number) => `v${i}@example.com`;
const pick = (random: () => number) =>
  random() < 0.8 ? Math.floor(random() * (VIEWERS / 10)) : Math.floor(random() * VIEWERS);

export async function churnBench(
  postgres: BenchPostgres,
  prefix: string,
  seconds: number,
  readsPerSecond: number,
): Promise<ChurnRow[]> {
  const database = `${prefix}churn`;
  await postgres.createDatabase(database);
  const url = postgres.url(database);
  const datatables = await createDatatables({ connection: url, secretKey: SECRET });
  try {
    await seed(datatables, url, prefix);
    const roles = Array.from({ length: ROLES }, (_, r) => `${prefix}c${r}`);
    const executor: JobExecutor = {
      // The run asks which roles of `main` its viewer holds: the same answers (role set and
      // versions) a `?as=viewer` lease depends on, without opening 10 000 viewers' connections.
      async run(job: Job) {
        const held: string[] = [];
        for (const role of roles) {
          if (await datatables.viewerHolds!(job, 'main', role)) held.push(role);
        }
        const value = { viewer: job.perms.endUserEmail, held };
        const json = new TextEncoder().encode(JSON.stringify(value));
        return { jobId: job.id, fromCache: false, value, json: () => json };
      },
    };
    const phase = async (withChurn: boolean): Promise<ChurnRow> => {
      const cached = withResultCache(executor, {
        store: new MemoryCacheStore({ maxBytes: '256mb' }),
        fingerprint: datatables.fingerprint,
      });
      const run = (i: number) =>
        cached.run({
          id: `j${i}`,
          workspace: WS,
          runnable: { path: 'f/report', hash: 'v1' },
          args: {},
          perms: { email: 'publisher@example.com', endUserEmail: viewer(i) },
          cacheTtlS: 3600,
        });
      for (let i = 0; i < VIEWERS; i++) await run(i); // warm: every viewer has an entry
      const random = prng(42);
      const changes = prng(7);
      const before = { ...cached.stats };
      let made = 0;
      for (let second = 0; second < seconds; second++) {
        if (withChurn) {
          // One membership change per second: a random viewer joins or leaves a random group.
          const who = viewer(Math.floor(changes() * VIEWERS));
          const group = `g${Math.floor(changes() * GROUPS)}`;
          const change =
            changes() < 0.5
              ? await datatables.admin.addMembership(WS, who, 'group', group)
              : await datatables.admin.removeMembership(WS, who, 'group', group);
          await datatables.waitForGeneration(change.generation);
          made++;
        }
        for (let r = 0; r < readsPerSecond; r++) await run(pick(random));
      }
      const hits = cached.stats.hits - before.hits;
      const misses = cached.stats.misses - before.misses;
      return {
        id: withChurn ? 'churn_hit_ratio' : 'steady_hit_ratio',
        label: withChurn
          ? `hit ratio with one membership change per second (${VIEWERS} viewers, ${GROUPS} groups)`
          : 'hit ratio of the same reads without changes (baseline)',
        reads: hits + misses,
        changes: made,
        hitRatio: hits / (hits + misses),
      };
    };
    const steady = await phase(false);
    const churn = await phase(true);
    return [steady, churn];
  } finally {
    await datatables.close();
  }
}

/** 10 roles over 50 groups (5 each), every viewer in 1–3 groups, loaded in bulk. */
async function seed(datatables: Datatables, url: string, prefix: string): Promise<void> {
  const { admin } = datatables;
  await admin.createDatatable(WS, 'main', { database: new URL(url).pathname.slice(1) });
  for (let r = 0; r < ROLES; r++) {
    const tenants = Array.from({ length: GROUPS / ROLES }, (_, k) => `group:g${r * 5 + k}`);
    await admin.createRole(WS, 'main', `${prefix}c${r}`, { tenants });
  }
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const random = prng(1);
    const rows: string[] = [];
    for (let i = 0; i < VIEWERS; i++) {
      const count = 1 + Math.floor(random() * 3);
      for (let k = 0; k < count; k++) {
        rows.push(`('${WS}', '${viewer(i)}', 'group', 'g${Math.floor(random() * GROUPS)}')`);
      }
    }
    await client.query(
      `insert into viewer_cache.membership (workspace, email, kind, name) values ${rows.join(',')}
       on conflict do nothing`,
    );
  } finally {
    await client.end();
  }
  // A catalog change after the bulk load, so every process reloads it.
  const last = await admin.addMembership(WS, viewer(0), 'group', 'g0');
  await datatables.waitForGeneration(last.generation);
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const postgres = await benchPostgres();
  const prefix = `vcb${process.pid}_`;
  try {
    const [steady, churn] = await churnBench(postgres, prefix, 20, 2000);
    for (const row of [steady!, churn!]) {
      console.log(
        `${row.id}: ${row.hitRatio.toFixed(4)} over ${row.reads} reads, ${row.changes} changes`,
      );
    }
    console.log(
      `churn ÷ steady: ${(churn!.hitRatio / steady!.hitRatio).toFixed(3)} (target ≥ 0.95)`,
    );
  } finally {
    await postgres.close(prefix);
  }
}
