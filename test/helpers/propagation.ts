import pg from 'pg';
import { createDatatables, type Datatables } from '../../src/index.js';
import { demoToken } from '../../src/server/credentials/tokens.js';
import type { ServerFleet } from './server_fleet.js';
import { httpRequest, isRecord, runCliJson } from './server_process.js';

// How long a change made through one process takes to reach every other process's next run.
// The scene: a fleet of reference servers on one database; the demo's alice (group emea, role
// <prefix>sales_emea) reads demo.orders through `f/orders/list` (cached for 60 s). A restrictive
// policy also requires an entitlement row (demo.entitlement, declared governing with the CLI).
// Each change revokes or restores alice's EMEA rows in one of five ways, made by one admin
// process (the library, as the CLI runs it) or, for entitlement rows and the policy (DDL in the
// data table's database, as a security engineer would), by a plain connection.
// Then every server is asked for alice's rows back to back until each reflects the change.

export const KINDS = ['role', 'membership', 'tenant', 'entitlement', 'policy'] as const;
export type ChangeKind = (typeof KINDS)[number];
export type Direction = 'revoke' | 'restore';

const WS = 'demo';
const ALICE = 'alice@example.com';
const EMEA_IDS = [1, 3];
/** Runs each server must answer in the new state, after its first, before it is done. */
const CONFIRM_RUNS = 3;

export interface ChangeSample {
  readonly kind: ChangeKind;
  readonly direction: Direction;
  /** How long the change itself took to return to its caller. */
  readonly changeMs: number;
  /** Per server: first run reflecting the change, started this long after the change returned (≥ 0). */
  readonly perServerMs: number[];
  /** The slowest server: every process's next run reflects the change after this. */
  readonly latencyMs: number;
  /** Runs started after the change returned that still answered the old state. */
  readonly staleAfterConfirm: number;
  /** The latest start (ms after the change returned) of such a run; 0 if none. */
  readonly staleWindowMs: number;
  /** Runs started `boundMs` or more after the change returned, or after one reflected it, still old. */
  readonly staleAfterBound: number;
  /** Runs counted after the change returned. */
  readonly runs: number;
}

type State = 'granted' | 'revoked' | 'other';

export interface PropagationScene {
  readonly admin: Datatables;
  /** A superuser connection to the shared database. */
  readonly sql: pg.Client;
  measure(kind: ChangeKind, direction: Direction, boundMs: number): Promise<ChangeSample>;
  close(): Promise<void>;
}

/**
 * Sets the scene up on a running fleet: the entitlement table and its policy, declared
 * governing through the CLI; an admin process of its own (the library); alice's token.
 */
export async function propagationScene(
  fleet: ServerFleet,
  options: {
    databaseUrl: string;
    prefix: string;
    secretKey: string;
    /**
     * The admin process waits for every server's acknowledgement (as the CLI does), and the
     * entitlement writer calls `awaitPropagation()` after its commit.
     */
    awaitPropagation?: boolean;
  },
): Promise<PropagationScene> {
  const emea = `${options.prefix}sales_emea`;
  const amer = `${options.prefix}sales_amer`;
  const sql = new pg.Client({ connectionString: options.databaseUrl });
  sql.on('error', () => {});
  await sql.connect();
  await sql.query(`create table if not exists demo.entitlement (
      email text not null, region text not null, primary key (email, region))`);
  await sql.query(
    `insert into demo.entitlement values ($1, 'emea'), ('bob@example.com', 'amer'),
      ('carol@example.com', 'emea'), ('carol@example.com', 'amer') on conflict do nothing`,
    [ALICE],
  );
  await sql.query(
    `grant select on demo.entitlement to ${pg.escapeIdentifier(emea)}, ${pg.escapeIdentifier(amer)}`,
  );
  await sql.query('drop policy if exists entitled on demo.orders');
  await sql.query(`create policy entitled on demo.orders as restrictive for select using (
      exists (select 1 from demo.entitlement e
               where e.email = (select viewer_cache.viewer_email()) and e.region = orders.region))`);
  await runCliJson(fleet.cliEnv, [
    'governing',
    'add',
    '--datatable',
    'main',
    '--table',
    'demo.entitlement',
    '--viewer-column',
    'email',
  ]);
  const admin = await createDatatables({
    connection: options.databaseUrl,
    secretKey: options.secretKey,
    catalog: { awaitPropagation: options.awaitPropagation ?? false },
  });
  const token = demoToken(options.secretKey, ALICE);

  const stateOf = async (url: string): Promise<State> => {
    const answer = await httpRequest(url, 'POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
      token,
      body: { path: 'f/orders/list' },
    });
    if (answer.status >= 400 && answer.status < 500) return 'revoked';
    const result = isRecord(answer.json) ? answer.json['result'] : undefined;
    if (answer.status !== 200 || !Array.isArray(result)) return 'other';
    const ids = result.map((row) => (isRecord(row) ? row['id'] : undefined));
    if (EMEA_IDS.every((id) => ids.includes(id))) return 'granted';
    return ids.some((id) => EMEA_IDS.includes(id as number)) ? 'other' : 'revoked';
  };

  // The demo's own policy, as it was: restored by 'policy' after each revoke.
  const { rows: policy } = await sql.query<{ qual: string }>(
    `select qual from pg_catalog.pg_policies
      where schemaname = 'demo' and tablename = 'orders' and policyname = 'orders_emea'`,
  );
  const emeaQual = policy[0]?.qual;
  if (emeaQual === undefined) throw new Error('the demo has no policy orders_emea');

  const apply = async (kind: ChangeKind, direction: Direction): Promise<void> => {
    const revoke = direction === 'revoke';
    const a = admin.admin;
    if (kind === 'policy') {
      await sql.query(
        `alter policy orders_emea on demo.orders using (${revoke ? 'false' : emeaQual})`,
      );
      if (options.awaitPropagation === true) await admin.awaitPropagation();
      return;
    }
    if (kind === 'role') await (revoke ? a.disableRole(WS, emea) : a.enableRole(WS, emea));
    else if (kind === 'membership') {
      await (revoke
        ? a.removeMembership(WS, ALICE, 'group', 'emea')
        : a.addMembership(WS, ALICE, 'group', 'emea'));
    } else if (kind === 'tenant') await a.setTenants(WS, emea, revoke ? [] : ['group:emea']);
    else {
      if (revoke)
        await sql.query(`delete from demo.entitlement where email = $1 and region = 'emea'`, [
          ALICE,
        ]);
      else await sql.query(`insert into demo.entitlement values ($1, 'emea')`, [ALICE]);
      // The application that wrote the row waits for it, as docs/several-processes.md tells
      // writers to.
      if (options.awaitPropagation === true) await admin.awaitPropagation();
    }
  };

  const settle = async (url: string, want: State, deadline: number) => {
    while ((await stateOf(url)) !== want) {
      if (performance.now() > deadline) throw new Error(`${url} never reached ${want}`);
    }
  };

  return {
    admin,
    sql,
    async measure(kind, direction, boundMs) {
      const before: State = direction === 'revoke' ? 'granted' : 'revoked';
      const after: State = direction === 'revoke' ? 'revoked' : 'granted';
      // Every server answers the old state (and has cached it) before the change.
      const deadline = performance.now() + 30_000;
      await Promise.all(fleet.urls.map((url) => settle(url, before, deadline)));
      const started = performance.now();
      await apply(kind, direction);
      const confirmed = performance.now();
      const perServer = await Promise.all(
        fleet.urls.map(async (url) => {
          let firstMs: number | null = null;
          let confirms = 0;
          let runs = 0;
          let staleAfterConfirm = 0;
          let staleWindowMs = 0;
          let staleAfterBound = 0;
          while (confirms < CONFIRM_RUNS) {
            const startedMs = performance.now() - confirmed;
            if (startedMs > 30_000) throw new Error(`${url}: ${kind} ${direction} never reflected`);
            const state = await stateOf(url);
            runs++;
            if (state === before) {
              staleAfterConfirm++;
              staleWindowMs = startedMs;
              if (startedMs >= boundMs || firstMs !== null) staleAfterBound++;
            } else if (state === after) {
              firstMs ??= startedMs;
              confirms++;
            }
          }
          return { firstMs: firstMs!, runs, staleAfterConfirm, staleWindowMs, staleAfterBound };
        }),
      );
      const sum = (f: (s: (typeof perServer)[number]) => number) =>
        perServer.reduce((total, s) => total + f(s), 0);
      return {
        kind,
        direction,
        changeMs: confirmed - started,
        perServerMs: perServer.map((s) => s.firstMs),
        latencyMs: Math.max(...perServer.map((s) => s.firstMs)),
        staleAfterConfirm: sum((s) => s.staleAfterConfirm),
        staleWindowMs: Math.max(...perServer.map((s) => s.staleWindowMs)),
        staleAfterBound: sum((s) => s.staleAfterBound),
        runs: sum((s) => s.runs),
      };
    },
    async close() {
      await admin.close();
      await sql.end().catch(() => {});
    },
  };
}

/** p-th percentile (nearest rank) of `values`. */
export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[
    Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))
  ]!;
}
