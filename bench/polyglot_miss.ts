/**
 * `npx tsx bench/polyglot_miss.ts [--rounds=N]`: what a Python or a DuckDB runnable adds to a
 * warm miss, against the SQL runnable asking the same thing (f/clinics/patients and its twins,
 * for one provider; login known, pool warm), and that a hit starts no python3 process and no
 * DuckDB instance. Short on purpose (about a minute); prints a table, writes nothing.
 */
import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { loadavg, tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  createDatatables,
  createExecutor,
  type DuckdbModule,
  type JobExecutor,
  MemoryCacheStore,
  withResultCache,
} from '../src/index.js';
import { clinicsWorld, seedClinics } from '../src/server/demo_clinics.js';
import { fmt, markdownTable } from './helpers.js';
import { benchPostgres } from './postgres_fixture.js';

const rounds = Number(
  process.argv.find((a) => a.startsWith('--rounds='))?.slice('--rounds='.length) ?? 40,
);
const PREFIX = `bpoly${process.pid}_`;
const NORA = 'nora@example.com';
const KINDS = [
  ['SQL (baseline)', 'f/clinics/patients'],
  ['Python', 'f/clinics/patients_py'],
  ['DuckDB', 'f/clinics/patients_duckdb'],
] as const;

const postgres = await benchPostgres();
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

  const rows = KINDS.map(([label, path]) => {
    const m = miss.get(path)!;
    const h = hit.get(path)!;
    return [
      label,
      `${fmt(m.p50)} ms`,
      `${fmt(m.p99)} ms`,
      `${fmt(m.p50 / base.p50, 2)}×`,
      `+${fmt(m.p50 - base.p50)} ms`,
      `${fmt(h.p50 * 1000)} µs`,
    ];
  });
  console.log(
    markdownTable(
      ['runnable (Nora, patients)', 'warm miss p50', 'p99', '× SQL', 'added', 'hit p50'],
      rows,
    ),
  );
  console.log(
    `\n${new Date().toISOString()}, Node ${process.version}, ${postgres.version}, load ${loadavg()
      .map((l) => l.toFixed(1))
      .join(
        ' ',
      )}; hits: ${rounds * 5 * KINDS.length}, python3 processes started by them: ${started.spawns}, DuckDB instances: ${started.instances}`,
  );
  if (started.spawns !== 0 || started.instances !== 0) process.exitCode = 1;
} finally {
  await datatables.close();
  await postgres.close(PREFIX);
  await rm(dir, { recursive: true, force: true });
}
