/**
 * Data-table scenarios: what connecting as the viewer adds to a runnable's own query,
 * what the first use of a new set login costs, and what the authorization fingerprint adds to
 * a hit. Each against a baseline measured in the same run.
 */
import pg from 'pg';
import { PasswordDeriver } from '../src/datatable/logins/passwords.js';
import { RoleSetProtocol } from '../src/datatable/logins/role_set_protocol.js';
import {
  createDatatables,
  createExecutor,
  type Datatables,
  type Job,
  MemoryCacheStore,
  type RunContext,
  withResultCache,
} from '../src/index.js';
import { BenchInvariantError, type LatencyPlan, measureLatency, type Scenario } from './helpers.js';
import type { BenchPostgres } from './postgres_fixture.js';

type Lib = typeof import('../src/index.js');

const WS = 'bench';
const SECRET = 'bench-secret-key-0123456789abcdef-0123456789';
const QUERY = 'select id, region, amount from orders order by id';
const ROLE_COUNT = 8;

export interface DatatableRow {
  readonly id: string;
  readonly label: string;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly ops: number;
  readonly baseline: string;
  /** p50 − baseline p50 (µs), or p50 ÷ baseline p50. */
  readonly vsBaseline: { kind: 'added' | 'ratio'; value: number };
  readonly target?: { text: string; met: boolean };
}

export async function datatableBench(
  postgres: BenchPostgres,
  prefix: string,
  plan: LatencyPlan,
  firstUseCount: number,
): Promise<DatatableRow[]> {
  const database = `${prefix}dt`;
  await postgres.createDatabase(database);
  const url = postgres.url(database);
  // Room for every prepared set login's warm connection: the prepared first-use row measures
  // preparation, not the connection cap evicting idle pools (a cap this bench never reaches
  // otherwise).
  const datatables = await createDatatables({
    connection: url,
    secretKey: SECRET,
    pools: { maxConnections: 100 },
  });
  try {
    const roles = await seed(datatables, url, database, prefix);
    const rows: DatatableRow[] = [];
    rows.push(...(await warmMiss(datatables, url, database, roles[0]!, plan)));
    rows.push(...(await fingerprintedHits(datatables, plan)));
    rows.push(...(await firstUse(datatables, url, database, roles, firstUseCount)));
    return rows;
  } finally {
    await datatables.close();
  }
}

/** Only the warm-miss rows (`bench/warm_miss.ts`): the same seed, no first-use logins. */
export async function warmMissBench(
  postgres: BenchPostgres,
  prefix: string,
  plan: LatencyPlan,
  /** Another build of the library (its `src/index.ts`): its two warm-miss rows join the rounds. */
  base?: Lib,
): Promise<DatatableRow[]> {
  const database = `${prefix}dt`;
  await postgres.createDatabase(database);
  const url = postgres.url(database);
  const datatables = await createDatatables({ connection: url, secretKey: SECRET });
  try {
    const roles = await seed(datatables, url, database, prefix);
    return await warmMiss(datatables, url, database, roles[0]!, plan, base);
  } finally {
    await datatables.close();
  }
}

/** `orders` with RLS by role; alice holds role 0, carol roles 0 and 1. */
async function seed(datatables: Datatables, url: string, database: string, prefix: string) {
  const { admin } = datatables;
  await admin.createDatatable(WS, 'main', { database });
  const roles: string[] = [];
  for (let r = 0; r < ROLE_COUNT; r++) {
    const name = `${prefix}r${r}`;
    await admin.createRole(WS, 'main', name, { tenants: [`group:g${r}`] });
    roles.push(name);
  }
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    await client.query('create table orders (id int primary key, region int not null, amount int)');
    await client.query(
      'insert into orders select i, i % $1, i * 10 from generate_series(1, 40) as i',
      [ROLE_COUNT],
    );
    await client.query('alter table orders enable row level security');
    for (let r = 0; r < ROLE_COUNT; r++) {
      const role = pg.escapeIdentifier(roles[r]!);
      await client.query(`grant select on orders to ${role}`);
      await client.query(
        `create policy p${r} on orders for select using (region = ${r} and pg_has_role(current_user, ${pg.escapeLiteral(roles[r]!)}, 'member'))`,
      );
    }
  } finally {
    await client.end();
  }
  await admin.addMembership(WS, 'alice@example.com', 'group', 'g0');
  await admin.addMembership(WS, 'carol@example.com', 'group', 'g0');
  const last = await admin.addMembership(WS, 'carol@example.com', 'group', 'g1');
  await datatables.waitForGeneration(last.generation);
  return roles;
}

const fmtMs = (us: number) => `${(us / 1000).toFixed(1)} ms`;

/** The managed password of a role's own login, derived as the library does. */
async function rolePassword(url: string, role: string): Promise<string> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query<{ oid: number; secret: Buffer }>(
      'select oid, secret from viewer_cache.role where name = $1',
      [role],
    );
    return new PasswordDeriver(SECRET).forRole(rows[0]!.oid, rows[0]!.secret);
  } finally {
    await client.end();
  }
}

function jobFor(viewer: string, path: string, cacheTtlS?: number): Job {
  return {
    id: 'bench',
    workspace: WS,
    runnable: { path, hash: 'v1' },
    args: {},
    perms: { email: 'publisher@example.com', endUserEmail: viewer },
    ...(cacheTtlS === undefined ? {} : { cacheTtlS }),
  };
}

/**
 * The runnable's own query on an already open connection of the role's login, beside the same
 * query run by a job that asks for `datatable('main', { as: 'viewer' })` with the login known
 * and its pool warm: the difference is what resolving, lending and resetting cost.
 */
async function warmMiss(
  datatables: Datatables,
  url: string,
  database: string,
  role: string,
  plan: LatencyPlan,
  base?: Lib,
): Promise<DatatableRow[]> {
  const password = await rolePassword(url, role);
  const parsed = new URL(url);
  const bare = new pg.Client({
    host: parsed.hostname,
    port: Number(parsed.port),
    database,
    user: role,
    password,
  });
  await bare.connect();
  const runnables = {
    orders: {
      hash: 'v1',
      fn: async (_args: Record<string, unknown>, ctx: RunContext) => {
        const client = await ctx.datatable('main', { as: 'viewer' });
        return (await client.query(QUERY)).rows.length;
      },
    },
  };
  const executor = createExecutor({ datatables, runnables });
  // The same runnables on an instance that skips the post-release login check, to show its cost.
  const unchecked = await createDatatables({
    connection: url,
    secretKey: SECRET,
    migrate: false,
    pools: { checkOnRelease: false, prepareAhead: false },
  });
  // And on one that binds no viewer identity, to show the cost of the binding.
  const anonymous = await createDatatables({
    connection: url,
    secretKey: SECRET,
    migrate: false,
    viewerIdentity: false,
    pools: { prepareAhead: false },
  });
  const noIdentityExecutor = createExecutor({ datatables: anonymous, runnables });
  // The same runnables on the other build, with its defaults, when one is compared.
  const other =
    base === undefined
      ? null
      : await base.createDatatables({ connection: url, secretKey: SECRET, migrate: false });
  const otherExecutor =
    other === null
      ? null
      : (base!.createExecutor({ datatables: other, runnables }) as unknown as typeof executor);
  const uncheckedExecutor = createExecutor({ datatables: unchecked, runnables });
  const expect =
    (viewer: string, rows: number, through = executor) =>
    async () => {
      const result = await through.run(jobFor(viewer, 'orders'));
      if (result.value !== rows)
        throw new BenchInvariantError(`${viewer} saw ${String(result.value)} rows`);
    };
  const scenarios: Scenario[] = [
    {
      id: 'pg_bare_query',
      label: "the runnable's query on an open connection of the role's login",
      async: true,
      op: () => bare.query(QUERY),
    },
    {
      id: 'datatable_warm_miss_role',
      label: 'job → `datatable(as viewer)` → one role: its own login, pool warm → same query',
      async: true,
      op: expect('alice@example.com', 5),
    },
    {
      id: 'datatable_warm_miss_set',
      label: 'same for a viewer with two roles: `wm_set_` login known, pool warm',
      async: true,
      op: expect('carol@example.com', 10),
    },
    {
      id: 'datatable_warm_miss_role_no_identity',
      label: 'the one-role run with `viewerIdentity: false` (no viewer bound to the backend)',
      async: true,
      op: expect('alice@example.com', 5, noIdentityExecutor),
    },
    {
      id: 'datatable_warm_miss_set_no_identity',
      label: 'the two-role run with `viewerIdentity: false`',
      async: true,
      op: expect('carol@example.com', 10, noIdentityExecutor),
    },
    {
      id: 'datatable_warm_miss_role_unchecked',
      label: 'the one-role run with `pools.checkOnRelease: false` (no post-release login check)',
      async: true,
      op: expect('alice@example.com', 5, uncheckedExecutor),
    },
    {
      id: 'datatable_warm_miss_set_unchecked',
      label: 'the two-role run with `pools.checkOnRelease: false`',
      async: true,
      op: expect('carol@example.com', 10, uncheckedExecutor),
    },
  ];
  if (otherExecutor !== null) {
    scenarios.push(
      {
        id: 'datatable_warm_miss_role_base',
        label: 'the one-role run on the other build (`VC_BASE_SRC`)',
        async: true,
        op: expect('alice@example.com', 5, otherExecutor),
      },
      {
        id: 'datatable_warm_miss_set_base',
        label: 'the two-role run on the other build',
        async: true,
        op: expect('carol@example.com', 10, otherExecutor),
      },
    );
  }
  try {
    const stats = await measureLatency(scenarios, plan);
    const bare = stats.get('pg_bare_query')!;
    return scenarios.map((s) => {
      const st = stats.get(s.id)!;
      const added = st.p50Us - bare.p50Us;
      return {
        id: s.id,
        label: s.label,
        p50Us: st.p50Us,
        p99Us: st.p99Us,
        ops: st.ops,
        baseline: 'pg_bare_query',
        vsBaseline: { kind: 'added', value: added },
        ...(s.id === 'pg_bare_query'
          ? {}
          : { target: { text: 'adds ≤ 300 µs', met: added <= 300 } }),
      };
    });
  } finally {
    await bare.end();
    await unchecked.close();
    await anonymous.close();
    await other?.close();
  }
}

/** A hit through `withResultCache` with and without `fingerprint: datatables.fingerprint`. */
async function fingerprintedHits(
  datatables: Datatables,
  plan: LatencyPlan,
): Promise<DatatableRow[]> {
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
  const viewers = Array.from({ length: 1000 }, (_, v) => `viewer${v}@example.com`);
  viewers[0] = 'carol@example.com';
  const jobs = viewers.map((viewer) => jobFor(viewer, 'orders', 3600));
  for (const job of jobs) {
    await plain.run(job);
    await fingerprinted.run(job);
  }
  const filled = executions;
  const hit = (cache: typeof plain) => async (i: number) => {
    const result = await cache.run(jobs[i % jobs.length]!);
    if (!result.fromCache) throw new BenchInvariantError('a fingerprinted "hit" executed');
  };
  const scenarios: Scenario[] = [
    {
      id: 'memory_hit_plain',
      label: 'hit, MemoryCacheStore, no fingerprint',
      async: true,
      op: hit(plain),
    },
    {
      id: 'memory_hit_fingerprinted',
      label:
        'hit, MemoryCacheStore, `fingerprint: datatables.fingerprint` (fingerprint from the in-memory catalog)',
      async: true,
      op: hit(fingerprinted),
      verify: () => {
        if (executions !== filled) throw new BenchInvariantError('a hit executed');
      },
    },
  ];
  const stats = await measureLatency(scenarios, plan);
  const base = stats.get('memory_hit_plain')!;
  return scenarios.map((s) => {
    const st = stats.get(s.id)!;
    const added = st.p50Us - base.p50Us;
    return {
      id: s.id,
      label: s.label,
      p50Us: st.p50Us,
      p99Us: st.p99Us,
      ops: st.ops,
      baseline: 'memory_hit_plain',
      vsBaseline: { kind: 'added', value: added },
      ...(s.id === 'memory_hit_fingerprinted'
        ? { target: { text: 'stays in µs (adds < 10 µs)', met: added < 10 } }
        : {}),
    };
  });
}

/**
 * First use of a new role set: a viewer whose groups make a set never seen before. Cold (the
 * process does not prepare set logins ahead): the run creates `wm_set_<hash>`, proves it can log
 * in with its first connection, and records it. Prepared: the membership change already made
 * the process prepare it, and the run finds a warm connection. Beside them, a bare scram
 * connection (Postgres's default 4096 rounds, as the bench's superuser) and one as a managed
 * login (whose verifiers use fewer rounds; see passwords.ts).
 */
async function firstUse(
  datatables: Datatables,
  url: string,
  database: string,
  roles: readonly string[],
  count: number,
): Promise<DatatableRow[]> {
  const sets: number[][] = [];
  for (let a = 0; a < ROLE_COUNT && sets.length < 2 * count; a++) {
    for (let b = a + 1; b < ROLE_COUNT && sets.length < 2 * count; b++) {
      for (let c = b + 1; c < ROLE_COUNT && sets.length < 2 * count; c++) {
        if (!(a === 0 && b === 1)) sets.push([a, b, c]);
      }
    }
  }
  const cold = await createDatatables({
    connection: url,
    secretKey: SECRET,
    migrate: false,
    pools: { prepareAhead: false },
  });
  try {
    const oidOf = new Map(
      (await datatables.admin.listRoles(WS)).map((role) => [role.name, role.oid]),
    );
    const loginOf = (set: number[]) =>
      RoleSetProtocol.loginName(set.map((r) => oidOf.get(roles[r]!)!));
    // Even sets: cold viewers; odd sets: viewers whose login is prepared ahead.
    const coldViewers: string[] = [];
    const preparedViewers: string[] = [];
    let generation = 0;
    for (const [i, set] of sets.entries()) {
      const viewer = `new${i}@example.com`;
      (i % 2 === 0 ? coldViewers : preparedViewers).push(viewer);
      for (const r of set) {
        ({ generation } = await datatables.admin.addMembership(WS, viewer, 'group', `g${r}`));
      }
    }
    await Promise.all([
      datatables.waitForGeneration(generation),
      cold.waitForGeneration(generation),
    ]);
    const prepared = sets.filter((_, i) => i % 2 === 1).map(loginOf);
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    try {
      const deadline = performance.now() + 60_000;
      for (;;) {
        const { rows } = await admin.query<{ n: string }>(
          'select count(*) as n from viewer_cache.role_set where login = any($1)',
          [prepared],
        );
        if (Number(rows[0]!.n) === prepared.length) break;
        if (performance.now() > deadline) throw new BenchInvariantError('logins not prepared');
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    } finally {
      await admin.end();
    }

    const parsed = new URL(url);
    const password = await rolePassword(url, roles[0]!);
    const bare: number[] = [];
    const managed: number[] = [];
    const coldFirst: number[] = [];
    const preparedFirst: number[] = [];
    const connectAs = async (user: string, pass: string, into: number[]) => {
      const t0 = performance.now();
      const probe = new pg.Client({
        host: parsed.hostname,
        port: Number(parsed.port),
        database,
        user,
        password: pass,
      });
      await probe.connect();
      into.push(performance.now() - t0);
      await probe.end();
    };
    const firstRun = async (instance: Datatables, viewer: string, into: number[]) => {
      const t1 = performance.now();
      const lease = await instance.connect(jobFor(viewer, 'x'), {
        name: 'main',
        access: { kind: 'viewer' },
      });
      into.push(performance.now() - t1);
      const { rows: who } = await lease.query('select current_user as u');
      await lease.release(false);
      if (!String(who[0]?.['u']).startsWith('wm_set_'))
        throw new BenchInvariantError('not a set login');
    };
    const superuser = decodeURIComponent(parsed.username);
    const superPassword = decodeURIComponent(parsed.password);
    for (let i = 0; i < coldViewers.length; i++) {
      // Alternate, so that noise lands on all alike.
      await connectAs(superuser, superPassword, bare);
      await firstRun(cold, coldViewers[i]!, coldFirst);
      await connectAs(roles[0]!, password, managed);
      if (i < preparedViewers.length)
        await firstRun(datatables, preparedViewers[i]!, preparedFirst);
    }
    const stat = (samples: number[]) => {
      const sorted = [...samples].sort((x, y) => x - y);
      const at = (p: number) =>
        sorted[Math.min(sorted.length - 1, Math.ceil(p * sorted.length) - 1)]! * 1000;
      return { p50Us: at(0.5), p99Us: at(0.99), ops: samples.length };
    };
    const base = stat(bare);
    const ratio = (row: { p50Us: number }) => row.p50Us / base.p50Us;
    const coldStat = stat(coldFirst);
    const preparedStat = stat(preparedFirst);
    const managedStat = stat(managed);
    return [
      {
        id: 'pg_new_scram_connection',
        label: 'a bare scram-sha-256 connection (Postgres default 4096 rounds)',
        ...base,
        baseline: 'pg_new_scram_connection',
        vsBaseline: { kind: 'ratio', value: 1 },
      },
      {
        id: 'pg_new_managed_connection',
        label: 'a new connection as a managed login (16-round verifier)',
        ...managedStat,
        baseline: 'pg_new_scram_connection',
        vsBaseline: { kind: 'ratio', value: ratio(managedStat) },
      },
      {
        id: 'set_login_first_use',
        label:
          'first use of a new role set, cold: create `wm_set_` login with its memberships, prove it with the first connection, record it',
        ...coldStat,
        baseline: 'pg_new_scram_connection',
        vsBaseline: { kind: 'ratio', value: ratio(coldStat) },
        // SPEC: first use of a new set login ≤ 1.5 × one bare scram connection.
        target: {
          text: `≤ 1.5× a bare connection: ${ratio(coldStat).toFixed(2)}× (${fmtMs(coldStat.p50Us)} vs ${fmtMs(base.p50Us)})`,
          met: ratio(coldStat) <= 1.5,
        },
      },
      {
        id: 'set_login_first_use_prepared',
        label:
          'first use of a new role set after the membership change prepared it ahead (pools.prepareAhead)',
        ...preparedStat,
        baseline: 'pg_new_scram_connection',
        vsBaseline: { kind: 'ratio', value: ratio(preparedStat) },
        target: {
          text: `≤ 1.5× a bare connection: ${ratio(preparedStat).toFixed(2)}×`,
          met: ratio(preparedStat) <= 1.5,
        },
      },
    ];
  } finally {
    await cold.close();
  }
}
