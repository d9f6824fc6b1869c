/**
 * What a Python or a DuckDB runnable adds to a warm miss, against the SQL runnable asking the
 * same thing (f/clinics/patients and its twins, for one provider; login known, pool warm), and
 * that a hit starts no python3 process and no DuckDB instance. Part of `npm run bench` (its
 * Postgres section); alone: `npx tsx bench/polyglot_miss.ts [--rounds=N]` prints the table.
 */
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import {
  createDatatables,
  createExecutor,
  type DuckdbModule,
  type JobExecutor,
  MemoryCacheStore,
  withResultCache,
} from '../src/index.js';
import { clinicsWorld, seedClinics } from '../src/server/demo/demo_clinics.js';
import { fmt, markdownTable } from './helpers.js';
import { type BenchPostgres, benchPostgres } from './postgres_fixture.js';

const NORA = 'nora@example.com';
const KINDS = [
  ['SQL (baseline)', 'f/clinics/patients'],
  ['Python', 'f/clinics/patients_py'],
  ['DuckDB', 'f/clinics/patients_duckdb'],
] as const;

/** One kind's figures, in milliseconds (hits too), with the baseline's in the same run. */
export interface PolyglotRow {
  readonly label: string;
  readonly path: string;
  readonly missP50: number;
  readonly missP99: number;
  /** This kind's warm-miss p50 over the SQL twin's. */
  readonly ratio: number;
  /** This kind's warm-miss p50 minus the SQL twin's. */
  readonly addedMs: number;
  readonly hitP50: number;
}

export interface PolyglotResult {
  readonly rows: readonly PolyglotRow[];
  readonly misses: number;
  readonly hits: number;
  /** python3 processes and DuckDB instances started by the hits: 0 and 0, or the run fails. */
  readonly startedByHits: { readonly spawns: number; readonly instances: number };
}

/**
 * `rounds` warm misses of each kind through the executor alone, then `rounds × 5` hits of each
 * through a result cache, counting the interpreters (a wrapper `python.command`) and the DuckDB
 * instances (a wrapping `duckdb.load`) started meanwhile.
 */
export async function polyglotMiss(
  postgres: BenchPostgres,
  prefix: string,
  rounds: number,
): Promise<PolyglotResult> {
  const PREFIX = `${prefix}poly_`;
  const database = `${PREFIX}db`;
  await postgres.createDatabase(database);
  const datatables = await createDatatables({
    connection: postgres.url(database),
    secretKey: 'bench-secret-key-0123456789abcdef-0123456789',
  });
  const dir = await mkdtemp(join(tmpdir(), 'vc-bench-py-'));
  try {
    await seedClinics({
      datatables,
      databaseUrl: postgres.url(database),
      workspace: 'demo',
      rolePrefix: PREFIX,
    });
    // Counted through the executor's own options: a wrapper interpreter, a wrapping loader.
    const counter = join(dir, 'spawns');
    await writeFile(counter, '');
    const command = join(dir, 'python3');
    await writeFile(command, `#!/bin/sh\necho x >> '${counter}'\nexec python3 "$@"\n`);
    await chmod(command, 0o755);
    let instances = 0;
    const real = (await import('@duckdb/node-api')) as unknown as DuckdbModule;
    const load = async (): Promise<DuckdbModule> => ({
      DuckDBInstance: {
        create: (path, options) => {
          instances++;
          return real.DuckDBInstance.create(path, options);
        },
      },
    });
    const executor = createExecutor({
      runnables: clinicsWorld(PREFIX, 'publisher@example.com').runnables,
      datatables,
      python: { command },
      duckdb: { load },
    });
    const spawns = async () => (await readFile(counter, 'utf8')).split('\n').length - 1;
    const job = (path: string) =>
      executor.createJob({
        workspace: 'demo',
        path,
        runAs: 'publisher@example.com',
        origin: { kind: 'app', session: { email: NORA } },
      });
    const time = async (through: JobExecutor, path: string, n: number) => {
      const samples: number[] = [];
      for (let i = 0; i < n; i++) {
        const started = performance.now();
        await through.run(job(path));
        samples.push(performance.now() - started);
      }
      samples.sort((a, b) => a - b);
      return {
        p50: samples[Math.floor(n / 2)]!,
        p99: samples[Math.min(n - 1, Math.floor(n * 0.99))]!,
      };
    };

    // Warm misses: the executor alone, every run executes (login known, pool warm after warm-up).
    const miss = new Map<string, { p50: number; p99: number }>();
    for (const [, path] of KINDS) await time(executor, path, 5);
    for (const [, path] of KINDS) miss.set(path, await time(executor, path, rounds));
    const base = miss.get('f/clinics/patients')!;

    // Hits: one miss to fill each entry, then only hits; nothing may start.
    const cached = withResultCache(executor, {
      store: new MemoryCacheStore(),
      fingerprint: datatables.fingerprint,
    });
    for (const [, path] of KINDS) await cached.run(job(path));
    const before = { spawns: await spawns(), instances };
    const hit = new Map<string, { p50: number; p99: number }>();
    for (const [, path] of KINDS) hit.set(path, await time(cached, path, rounds * 5));
    const started = {
      spawns: (await spawns()) - before.spawns,
      instances: instances - before.instances,
    };

    const rows = KINDS.map(([label, path]): PolyglotRow => {
      const m = miss.get(path)!;
      return {
        label,
        path,
        missP50: m.p50,
        missP99: m.p99,
        ratio: m.p50 / base.p50,
        addedMs: m.p50 - base.p50,
        hitP50: hit.get(path)!.p50,
      };
    });
    return {
      rows,
      misses: rounds * KINDS.length,
      hits: rounds * 5 * KINDS.length,
      startedByHits: started,
    };
  } finally {
    // Its database and roles (named after `prefix`) go with the caller's postgres.close(prefix).
    await datatables.close();
    await rm(dir, { recursive: true, force: true });
  }
}

/** The Markdown table of a run, with the hits' count of started processes and instances. */
export function polyglotTable(result: PolyglotResult): string {
  return [
    `**Python and DuckDB runnables** (\`bench/polyglot_miss.ts\`: warm misses of f/clinics/patients and its twins for one provider, against the SQL runnable in the same run; then ${result.hits} hits, which started **${result.startedByHits.spawns}** python3 processes and **${result.startedByHits.instances}** DuckDB instances):`,
    '',
    markdownTable(
      ['runnable (Nora, patients)', 'warm miss p50', 'p99', '× SQL', 'added', 'hit p50'],
      result.rows.map((r) => [
        r.label,
        `${fmt(r.missP50)} ms`,
        `${fmt(r.missP99)} ms`,
        r.path === KINDS[0][1] ? 'baseline' : `${fmt(r.ratio, 2)}×`,
        r.path === KINDS[0][1] ? '' : `+${fmt(r.addedMs)} ms`,
        `${fmt(r.hitP50 * 1000)} µs`,
      ]),
    ),
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? '').href) {
  const rounds = Number(
    process.argv.find((a) => a.startsWith('--rounds='))?.slice('--rounds='.length) ?? 40,
  );
  const prefix = `bpoly${process.pid}_`;
  const postgres = await benchPostgres();
  let result: PolyglotResult;
  try {
    result = await polyglotMiss(postgres, prefix, rounds);
  } finally {
    await postgres.close(prefix);
  }
  console.log(polyglotTable(result));
  console.log(
    `\n${new Date().toISOString()}, Node ${process.version}, ${postgres.version}, load ${loadavg()
      .map((l) => l.toFixed(1))
      .join(' ')}`,
  );
  // A hit that started anything is a failure of the hit path, not a figure.
  if (result.startedByHits.spawns !== 0 || result.startedByHits.instances !== 0)
    process.exitCode = 1;
}
