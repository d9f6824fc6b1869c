import pg from 'pg';
import { type Datatables, type RunnableDefinition, withTransaction } from '../../index.js';
import { type AppDefinition, type AppsContext, defineApps } from '../apps/apps.js';
import { clinicsPolyglotRunnables } from './demo_clinics_polyglot.js';
import { DEMO_PUBLISHER, DEMO_WORKSPACE } from './demo_users.js';

// The second demo app: the dataset of the row-level-security guide (seeds/textql-row-level-
// security.md). Patients carry their provider's email and their health system; an entitlements
// table keyed by email says which health systems each person may see. Postgres is the judge:
// policies read the run's viewer with viewer_cache.viewer_email(), and the entitlements table is a
// governing table, so deleting a row applies on that viewer's next run.
//
// The guide's rules are per query, and so are these: patient detail narrows the viewer's
// connection to the provider role (whatever else they hold, only the provider policy applies),
// and the counts read a view that counts every patient of the viewer's entitled health systems
// for a provider or a system administrator alike, and never returns a patient row.

export const CLINICS_DATATABLE = 'clinics';
export const CLINICS_APP = 'clinics';
export const CLINICS_PUBLIC_APP = 'clinics-public';

/** The guide's viewers: who they are, their groups (hence roles), their entitlements. */
export const CLINIC_USERS = {
  /** A provider at Health System North. */
  'nora@example.com': { groups: ['providers'], systems: ['north'] },
  /** A second provider at North. */
  'nick@example.com': { groups: ['providers'], systems: ['north'] },
  /** A provider at Health System South. */
  'sam@example.com': { groups: ['providers'], systems: ['south'] },
  /** A North system administrator: per-clinic counts, no patient detail. */
  'ada@example.com': { groups: ['system_admins'], systems: ['north'] },
  /** Someone with the provider role but no entitlement row. */
  'rita@example.com': { groups: ['providers'], systems: [] },
  /** A provider at North who is also a system administrator: detail is still her own patients. */
  'dana@example.com': { groups: ['providers', 'system_admins'], systems: ['north'] },
} as const satisfies Record<string, { groups: readonly string[]; systems: readonly string[] }>;

/** The role names of the clinics data table (prefixed in tests: roles are cluster-wide). */
export function clinicRoles(rolePrefix = '') {
  return {
    provider: `${rolePrefix}provider`,
    systemAdmin: `${rolePrefix}system_admin`,
    /** The data table's default role: the clinic list only, no patients, no viewer. */
    directory: `${rolePrefix}clinics_directory`,
    /** Embed viewers of the clinics app (`embed:clinics`): the patients of their signed system. */
    embed: `${rolePrefix}clinics_embed`,
  };
}

/** The clinics app's runnables, apps and schedule. */
export function clinicsWorld(rolePrefix = '', publisher: string) {
  const roles = clinicRoles(rolePrefix);
  /** The viewer's connection, narrowed to those of their roles that `names` lists. */
  const viewerAs = (...names: string[]) =>
    `datatable://${CLINICS_DATATABLE}?as=viewer&roles=${[...names].sort().join(',')}`;
  const runnables: Record<string, RunnableDefinition> = {
    // Patient detail (the guide's first governed query): the provider role only, whatever else
    // the viewer holds — a provider who is also a system administrator gets the provider policy
    // alone, so her own patients. Without the role: E_ROLE_REQUIRED, before any query.
    'f/clinics/patients': {
      kind: 'sql',
      database: viewerAs(roles.provider),
      sql: 'select patient_id, name, clinic from clinics.patients order by patient_id',
      cacheTtlS: 60,
    },
    // Aggregates (the guide's second file, `can_summarize = provider or system_admin`): every
    // patient of the viewer's entitled health systems counted per clinic — or, for an embed
    // viewer, of the health system its link was signed for — never a patient row. The view
    // decides; the narrowing refuses anyone holding none of the roles it serves.
    'f/clinics/counts': {
      kind: 'sql',
      database: viewerAs(roles.provider, roles.systemAdmin, roles.embed),
      sql: 'select clinic, patients from clinics.patient_counts order by clinic',
      cacheTtlS: 60,
    },
    // What the schedule runs as the app's creator: a query on the default role (not the viewer's
    // connection) that reads the viewer's identity. There is none, so Postgres refuses it.
    'f/clinics/digest': {
      fn: async (_args, ctx) => {
        const client = await ctx.datatable(CLINICS_DATATABLE);
        const { rows } = await client.query(
          `select c.name, (select viewer_cache.viewer_email()) as for_viewer
             from clinics.clinics c order by c.id`,
        );
        return rows;
      },
    },
    // --- Python and DuckDB twins of patients and counts ---
    ...clinicsPolyglotRunnables(CLINICS_DATATABLE, roles),
    // --- end of the twins ---
  };
  const paths = Object.keys(runnables);
  const apps: Record<string, AppDefinition> = {
    [CLINICS_APP]: { publisher, public: false, runnables: paths },
    [CLINICS_PUBLIC_APP]: { publisher, public: true, runnables: paths },
  };
  const detail = { expect: { refusedWithoutRole: true } };
  const counts = { expect: { noColumns: ['patient_id', 'name', 'provider_email'] } };
  return {
    runnables,
    apps,
    // `viewer-cache audit --demo`: patient detail is refused without the provider role; the
    // counts never carry a patient column. The digest is the schedule's (no viewer) and is not
    // audited. The two objects below are meant to be as they are.
    audit: {
      runnables: {
        'f/clinics/patients': detail,
        'f/clinics/patients_py': detail,
        'f/clinics/patients_duckdb': detail,
        'f/clinics/counts': counts,
        'f/clinics/counts_py': counts,
        'f/clinics/counts_duckdb': counts,
      },
      intended: {
        'clinics.clinics': 'the clinic directory: every clinics role may read every clinic',
        'clinics.patient_counts':
          "an aggregate view whose WHERE is the rule (the guide's counts): it returns no patient row",
      },
    },
    schedules: [
      { name: 'clinics-digest', path: 'f/clinics/digest', owner: publisher },
      // Each provider's own patients, delivered to their outbox.
      {
        name: 'clinics-per-provider',
        path: 'f/clinics/patients',
        owner: publisher,
        recipients: { group: 'providers' },
      },
    ],
  };
}

/**
 * The clinics world as an apps module (`loadApps('demo')` serves it with the orders module, only
 * when the demo was seeded); role names carry `VIEWER_CACHE_DEMO_ROLE_PREFIX`, as seeded.
 */
export default defineApps(({ env }: AppsContext) => ({
  workspace: DEMO_WORKSPACE,
  ...clinicsWorld(env['VIEWER_CACHE_DEMO_ROLE_PREFIX'] ?? '', DEMO_PUBLISHER),
}));

/**
 * Seeds the clinics data table in the catalog's database (a governing table must live there);
 * every step is idempotent, and memberships and entitlements are written on the first start only,
 * so a later start does not undo a revocation.
 */
export async function seedClinics(options: {
  datatables: Datatables;
  databaseUrl: string;
  workspace: string;
  rolePrefix?: string;
}): Promise<{ roles: ReturnType<typeof clinicRoles> }> {
  const { datatables, databaseUrl, workspace } = options;
  const admin = datatables.admin;
  const roles = clinicRoles(options.rolePrefix);
  const database = new URL(databaseUrl).pathname.slice(1) || 'postgres';

  await admin.createDatatable(workspace, CLINICS_DATATABLE, { database });
  const existing = new Set(
    (await admin.listRoles(workspace))
      .filter((role) => role.datatable === CLINICS_DATATABLE)
      .map((role) => role.name),
  );
  const firstStart = existing.size === 0;
  if (!existing.has(roles.provider))
    await admin.createRole(workspace, CLINICS_DATATABLE, roles.provider, {
      tenants: ['group:providers'],
    });
  if (!existing.has(roles.systemAdmin))
    await admin.createRole(workspace, CLINICS_DATATABLE, roles.systemAdmin, {
      tenants: ['group:system_admins'],
    });
  if (!existing.has(roles.directory))
    await admin.createRole(workspace, CLINICS_DATATABLE, roles.directory, { tenants: [] });
  if (!existing.has(roles.embed))
    await admin.createRole(workspace, CLINICS_DATATABLE, roles.embed, {
      tenants: [`embed:${CLINICS_APP}`],
    });

  const client = new pg.Client({ connectionString: databaseUrl });
  client.on('error', () => {});
  await client.connect();
  try {
    await withTransaction(client, () => createDataset(client, roles, firstStart));
  } finally {
    await client.end();
  }

  await admin.setDefaultRole(workspace, CLINICS_DATATABLE, roles.directory);
  // Deleting (or adding) someone's entitlement makes that person's next run miss.
  await admin.addGoverningTable(workspace, CLINICS_DATATABLE, 'clinics.entitlements', {
    viewerColumn: 'email',
  });
  if (firstStart) {
    let last = { generation: 0 };
    for (const [email, { groups }] of Object.entries(CLINIC_USERS))
      for (const group of groups)
        last = await admin.addMembership(workspace, email, 'group', group);
    await datatables.waitForGeneration(last.generation);
  }
  return { roles };
}

const CLINICS = [
  ['n1', 'North Main', 'north'],
  ['n2', 'North Lakeside', 'north'],
  ['s1', 'South Central', 'south'],
] as const;

/** [id, name, clinic, provider] — the health system is the clinic's. */
const PATIENTS = [
  [1, 'P. Ames', 'n1', 'nora@example.com'],
  [2, 'P. Brook', 'n2', 'nora@example.com'],
  [3, 'P. Chen', 'n1', 'nick@example.com'],
  [4, 'P. Diaz', 'n2', 'nick@example.com'],
  [5, 'P. Evans', 's1', 'sam@example.com'],
  [6, 'P. Ford', 's1', 'sam@example.com'],
  // Nora's patient at South, where she holds no entitlement: never shown to her.
  [7, 'P. Gray', 's1', 'nora@example.com'],
  // Rita's patient: she has the provider role but no entitlement row.
  [8, 'P. Hale', 'n1', 'rita@example.com'],
  // Dana's: a provider who is also a system administrator.
  [9, 'P. Irwin', 'n2', 'dana@example.com'],
] as const;

async function createDataset(
  client: pg.Client,
  roles: ReturnType<typeof clinicRoles>,
  firstStart: boolean,
): Promise<void> {
  const provider = pg.escapeIdentifier(roles.provider);
  const systemAdmin = pg.escapeIdentifier(roles.systemAdmin);
  const directory = pg.escapeIdentifier(roles.directory);
  const embed = pg.escapeIdentifier(roles.embed);
  await client.query('create schema if not exists clinics');
  await client.query(
    `create table if not exists clinics.clinics (
       id text primary key, name text not null, health_system text not null)`,
  );
  await client.query(
    `create table if not exists clinics.patients (
       patient_id int primary key, name text not null,
       clinic text not null references clinics.clinics (id),
       health_system text not null, provider_email text not null)`,
  );
  await client.query(
    `create table if not exists clinics.entitlements (
       email text not null, health_system text not null, primary key (email, health_system))`,
  );
  for (const [id, name, system] of CLINICS)
    await client.query(
      'insert into clinics.clinics values ($1, $2, $3) on conflict (id) do nothing',
      [id, name, system],
    );
  const systemOf = new Map<string, string>(CLINICS.map(([id, , system]) => [id, system]));
  for (const [id, name, clinic, email] of PATIENTS)
    await client.query(
      'insert into clinics.patients values ($1, $2, $3, $4, $5) on conflict (patient_id) do nothing',
      [id, name, clinic, systemOf.get(clinic), email],
    );
  if (firstStart) {
    for (const [email, { systems }] of Object.entries(CLINIC_USERS))
      for (const system of systems)
        await client.query(
          'insert into clinics.entitlements values ($1, $2) on conflict do nothing',
          [email, system],
        );
  }

  await client.query(
    `grant usage on schema clinics to ${provider}, ${systemAdmin}, ${directory}, ${embed}`,
  );
  await client.query(
    `grant select on clinics.clinics to ${provider}, ${systemAdmin}, ${directory}`,
  );
  // Patient rows are for providers only: a system administrator or an embed viewer can never
  // read one, through any runnable (they get counts, below). Revoked too, for a database seeded
  // by an older version, where they could.
  await client.query(`revoke select on clinics.patients, clinics.entitlements from ${systemAdmin}`);
  await client.query(`revoke select on clinics.patients from ${embed}`);
  await client.query(`grant select on clinics.patients, clinics.entitlements to ${provider}`);
  await client.query('alter table clinics.patients enable row level security');
  await client.query('alter table clinics.entitlements enable row level security');

  // `(select …)` makes Postgres read the identity once per query, not once per row.
  const me = '(select viewer_cache.viewer_email())';
  const entitled = `exists (select 1 from clinics.entitlements e
                            where e.email = ${me} and e.health_system = patients.health_system)`;
  // Each policy is written TO the role it serves, and permissive policies add up: a connection
  // holding two roles sees what either policy lets through. Patient detail therefore narrows to
  // the provider role (f/clinics/patients), so only this policy applies to it.
  const policies: [string, string, string, string][] = [
    // A provider reads only their own entitlement rows.
    ['entitlements_own', 'clinics.entitlements', provider, `email = ${me}`],
    // A provider: their own patients, in a health system they are entitled to.
    [
      'patients_provider',
      'clinics.patients',
      provider,
      `pg_has_role(current_user, ${pg.escapeLiteral(roles.provider)}, 'member')
         and provider_email = ${me} and ${entitled}`,
    ],
  ];
  // Earlier versions opened patient rows to system administrators and embed viewers.
  for (const gone of ['patients_system_admin', 'patients_embed'])
    await client.query(`drop policy if exists ${gone} on clinics.patients`);
  for (const [name, table, to, using] of policies) {
    await client.query(`drop policy if exists ${name} on ${table}`);
    await client.query(`create policy ${name} on ${table} for select to ${to} using (${using})`);
  }

  // The counts: a view owned by the tables' owner, so it reads every patient and entitlement
  // (the table policies do not apply to it) and its WHERE is the rule, as the guide's aggregate
  // file writes it — every patient of the viewer's entitled health systems, for a provider or a
  // system administrator alike; for an embed viewer, of the health system its link was signed
  // for. Only counts leave it. `current_user` is the caller's (a view does not change it), so a
  // narrowed or `SET ROLE` connection is judged by the roles it holds. The CASE keeps each
  // identity read to its branch: an embed viewer may have no email, a signed-in user has no
  // attributes; either read raises (fail closed) rather than answer for nobody.
  const member = (role: string) =>
    `(select pg_has_role(current_user, ${pg.escapeLiteral(role)}, 'member'))`;
  await client.query(
    `create or replace view clinics.patient_counts with (security_barrier) as
       select p.clinic, count(*)::int as patients
         from clinics.patients p
        where case
                when ${member(roles.provider)} or ${member(roles.systemAdmin)} then
                  exists (select 1 from clinics.entitlements e
                           where e.email = ${me} and e.health_system = p.health_system)
                when ${member(roles.embed)} then
                  p.health_system = (select viewer_cache.viewer_attribute('health_system'))
                else false
              end
        group by p.clinic`,
  );
  await client.query('revoke all on clinics.patient_counts from public');
  await client.query(
    `grant select on clinics.patient_counts to ${provider}, ${systemAdmin}, ${embed}`,
  );
}
