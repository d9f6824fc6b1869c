import type pg from 'pg';
import * as sql from './sql/policy_lints.js';

/** The lints, by what they find. */
export type PolicyLint =
  /** A table (or materialised/foreign table) a data-table role can reach with row security off. */
  | 'rls-off'
  /** Permissive policies written TO different data-table roles on one table: they add up. */
  | 'permissive-policies-add-up'
  /** A policy for every role (TO PUBLIC) that tests neither a role nor the viewer's identity. */
  | 'policy-tests-nobody'
  /** A view granted to a data-table role that reads its tables with its owner's rights. */
  | 'view-owner-rights'
  /** A `SECURITY DEFINER` function a data-table role may execute. */
  | 'security-definer-function';

/**
 * One finding: the object, what is wrong with it and the fix. `status` is `fail`, or `intended`
 * when the user marked the object as meant to be that way (an aggregate view owned by the
 * tables' owner, a public directory table), with their reason.
 */
export interface PolicyFinding {
  readonly lint: PolicyLint;
  readonly status: 'fail' | 'intended';
  /** The data table whose database holds the object. */
  readonly datatable: string;
  /** `schema.name`, or `schema.name(args)` for a function, or `schema.table/policy`. */
  readonly object: string;
  /** The data-table roles concerned. */
  readonly roles: readonly string[];
  readonly message: string;
  readonly fix: string;
  /** The user's reason, when `status` is `intended`. */
  readonly intended?: string;
}

/** What {@link lintPolicies} reads. */
export interface PolicyLintInput {
  /** A connection to the data table's database (any role that can read the system catalogs). */
  readonly client: Pick<pg.ClientBase, 'query'>;
  /** The data table's name, for the findings. */
  readonly datatable: string;
  /** The data table's roles (catalog names), `admin` excluded. */
  readonly roles: readonly string[];
  /**
   * Objects meant to be as they are (`schema.name` → why): their findings are reported with
   * status `intended`, not `fail`. @default {}
   */
  readonly intended?: Readonly<Record<string, string>>;
}

/** What a role test or an identity read looks like in a policy expression as Postgres prints it. */
const TESTS_SOMEONE =
  /\b(pg_has_role|current_user|current_role|session_user|viewer_cache\.viewer_email|viewer_cache\.viewer_attribute)\b/;

/**
 * Lints one data table's rules as Postgres holds them (system catalogs only, no run): every table
 * a data-table role reaches with row security off; permissive policies of different roles on one
 * table; policies for everyone that test no one; views granted to a data-table role that read
 * with their owner's rights (no `security_invoker`); `SECURITY DEFINER` functions a data-table role
 * may execute. Each finding names the object and the fix.
 */
export async function lintPolicies(input: PolicyLintInput): Promise<PolicyFinding[]> {
  const { client, datatable } = input;
  const roles = [...input.roles];
  const intended = input.intended ?? {};
  const findings: PolicyFinding[] = [];
  const add = (finding: Omit<PolicyFinding, 'status' | 'datatable'>, name: string) => {
    const reason = Object.hasOwn(intended, name) ? intended[name] : undefined;
    findings.push({
      ...finding,
      datatable,
      status: reason === undefined ? 'fail' : 'intended',
      ...(reason === undefined ? {} : { intended: reason }),
    });
  };
  if (roles.length === 0) return findings;

  const relations = await client.query<{
    schema: string;
    name: string;
    kind: string;
    rls: boolean;
    invoker: boolean;
    roles: string[];
  }>(sql.GRANTED_RELATIONS, [roles]);
  for (const rel of relations.rows) {
    const name = `${rel.schema}.${rel.name}`;
    const who = rel.roles.join(', ');
    if (rel.kind === 'v') {
      if (!rel.invoker)
        add(
          {
            lint: 'view-owner-rights',
            object: name,
            roles: rel.roles,
            message: `view ${name} is granted to ${who} and reads its tables with its owner's rights: the tables' policies do not apply to what it returns`,
            fix: `ALTER VIEW ${name} SET (security_invoker = true), or mark it intended if its WHERE is the rule (an aggregate view)`,
          },
          name,
        );
    } else if (!rel.rls) {
      add(
        {
          lint: 'rls-off',
          object: name,
          roles: rel.roles,
          message: `${rel.kind === 'm' ? 'materialised view' : 'table'} ${name} is granted to ${who} with row security off: every viewer holding one of them reads every row`,
          fix:
            rel.kind === 'm'
              ? `REVOKE ALL ON ${name} FROM ${who}, and serve it through a view with security_invoker, or mark it intended`
              : `ALTER TABLE ${name} ENABLE ROW LEVEL SECURITY and write a policy per role, or REVOKE ALL ON ${name} FROM ${who}, or mark it intended (a directory everyone may read)`,
        },
        name,
      );
    }
  }

  const policies = await client.query<{
    schema: string;
    table: string;
    name: string;
    permissive: boolean;
    command: string;
    roles: string[];
    using_expr: string;
    check_expr: string;
  }>(sql.POLICIES);
  const ours = new Set(roles);
  const byTable = new Map<string, typeof policies.rows>();
  for (const policy of policies.rows) {
    const table = `${policy.schema}.${policy.table}`;
    byTable.set(table, [...(byTable.get(table) ?? []), policy]);
    const text = `${policy.using_expr} ${policy.check_expr}`;
    if (policy.roles.length === 0 && !TESTS_SOMEONE.test(text))
      add(
        {
          lint: 'policy-tests-nobody',
          object: `${table}/${policy.name}`,
          roles: [],
          message: `policy ${policy.name} on ${table} applies to every role and tests neither a role nor the viewer (${truncate(policy.using_expr || policy.check_expr)}): every viewer gets the same rows`,
          fix: `write it TO the role it serves (CREATE POLICY … TO role), or test the viewer: … = (select viewer_cache.viewer_email())`,
        },
        `${table}/${policy.name}`,
      );
  }
  for (const [table, list] of byTable) {
    // Permissive policies are OR-ed: a connection holding two roles passes either one's test.
    const permissive = list.filter((p) => p.permissive);
    const distinct = new Set<string>();
    const names = new Set<string>();
    for (const command of ['r', 'a', 'w', 'd']) {
      const applying = permissive.filter((p) => p.command === command || p.command === '*');
      const to = new Set(applying.flatMap((p) => p.roles.filter((role) => ours.has(role))));
      if (to.size < 2) continue;
      for (const role of to) distinct.add(role);
      for (const p of applying) if (p.roles.some((role) => ours.has(role))) names.add(p.name);
    }
    if (distinct.size < 2) continue;
    const who = [...distinct].sort();
    add(
      {
        lint: 'permissive-policies-add-up',
        object: table,
        roles: who,
        message: `permissive policies ${[...names].sort().join(', ')} on ${table} are written to different roles (${who.join(', ')}): a viewer holding several sees what any one lets through`,
        fix: `narrow the runnables that read ${table} to one role (datatable://NAME?as=viewer&roles=ROLE), or write the stricter test as a policy AS RESTRICTIVE so it applies to every role`,
      },
      table,
    );
  }

  const functions = await client.query<{
    schema: string;
    name: string;
    arguments: string;
    roles: string[];
  }>(sql.DEFINER_FUNCTIONS, [roles]);
  for (const fn of functions.rows) {
    const name = `${fn.schema}.${fn.name}`;
    add(
      {
        lint: 'security-definer-function',
        object: `${name}(${fn.arguments})`,
        roles: fn.roles,
        message: `SECURITY DEFINER function ${name}(${fn.arguments}) may be executed by ${fn.roles.join(', ')}: it reads with its owner's rights, past every policy`,
        fix: `ALTER FUNCTION ${name}(${fn.arguments}) SECURITY INVOKER, or REVOKE EXECUTE ON FUNCTION ${name}(${fn.arguments}) FROM PUBLIC, ${fn.roles.join(', ')}, or mark it intended`,
      },
      name,
    );
  }
  return findings;
}

/** Whether any policy or view of the data table's database reads the viewer's identity. */
export async function readsViewerIdentity(client: Pick<pg.ClientBase, 'query'>): Promise<boolean> {
  const { rows } = await client.query<{ reads: boolean }>(sql.READS_IDENTITY);
  return rows[0]?.reads === true;
}

function truncate(text: string): string {
  return text.length > 80 ? `${text.slice(0, 77)}...` : text;
}
