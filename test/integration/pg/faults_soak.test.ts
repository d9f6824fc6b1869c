import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import type { RoleSetStep } from '../../../src/datatable/logins/role_set_protocol.js';
import { type Executor, ViewerCacheError } from '../../../src/index.js';
import {
  ALICE,
  advisoryLockHolders,
  BOB,
  CAROL,
  faultExecutor,
  libraryBackends,
  run,
  terminate,
  waitUntil,
  watchUncaught,
  within,
} from '../../helpers/faults.js';
import { type OrdersDb, ordersDb, WS } from '../../helpers/orders_db.js';

// Issue 8 §1 soak, SPEC invariant 16: a few thousand runs over five viewers (two single-role
// logins, three set logins) while a background loop terminates random library backends — login
// connections, admin connections, the LISTEN connection — another process disables and enables
// a role (so set logins are retired and recreated all along), and the set-login protocol has
// its lock-holding admin connection terminated while it is paused between steps. Afterwards:
// the process is alive (no uncaught error), nothing is left checked out, close() resolves, and
// every run returned its own viewer's rows or a coded error — never another viewer's rows,
// never an uncoded error.

const DAVE = 'dave@example.com'; // emea + apac
const ERIN = 'erin@example.com'; // amer + apac
/** What each viewer may see: with APAC enabled, or while it is disabled. */
const ALLOWED: Record<string, number[][]> = {
  [ALICE]: [[1, 3]],
  [BOB]: [[2]],
  [CAROL]: [[1, 2, 3]],
  [DAVE]: [
    [1, 3, 4],
    [1, 3],
  ],
  [ERIN]: [[2, 4], [2]],
};
const VIEWERS = Object.keys(ALLOWED);
const POOL_SIZE = 4;
const TARGET_RUNS = 6000;
const MAX_MS = 40_000;
const MID_PROTOCOL: RoleSetStep[] = [
  'read-row',
  'read-login',
  'create-login',
  'alter-login',
  'sync-memberships',
  'verify-login',
  'insert-row',
];

let fx: OrdersDb;
let runner: Datatables;
let onRunner: Executor;
let admin: Datatables;
let chaos = false;
const stats = {
  runs: 0,
  ok: 0,
  errors: {} as Record<string, number>,
  terminated: 0,
  midProtocol: 0,
  adminFailures: 0,
};

beforeAll(async () => {
  fx = await ordersDb();
  const { admin: setup } = fx.datatables;
  await setup.addMembership(WS, DAVE, 'group', 'emea');
  await setup.addMembership(WS, DAVE, 'group', 'apac');
  await setup.addMembership(WS, ERIN, 'group', 'amer');
  await fx.settle((await setup.addMembership(WS, ERIN, 'group', 'apac')).generation);
  runner = await fx.open(
    { migrate: false, pools: { size: POOL_SIZE } },
    {
      beforeLoginStep: async (step) => {
        if (!chaos || !MID_PROTOCOL.includes(step) || Math.random() > 0.2) return;
        // Paused between two statements of the protocol: its lock holder dies now.
        const holders = await advisoryLockHolders(fx);
        await terminate(fx.sql, holders);
        stats.midProtocol += holders.length;
      },
    },
  );
  onRunner = faultExecutor(runner);
  admin = await fx.open({ migrate: false });
});

afterAll(async () => {
  await fx?.close();
});

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function oneRun(viewer: string): Promise<void> {
  const path = Math.random() < 0.5 ? 'orders' : 'script';
  const args = path === 'script' ? { script: ['select pg_backend_pid()', 'select 1'] } : undefined;
  try {
    const { value } = await run(onRunner, path, viewer, args);
    expect(ALLOWED[viewer], `rows of ${viewer}`).toContainEqual(value);
    stats.ok++;
  } catch (err) {
    if (!(err instanceof ViewerCacheError) || err.code === 'E_EXECUTOR_FAILED') throw err;
    stats.errors[err.code] = (stats.errors[err.code] ?? 0) + 1;
  } finally {
    stats.runs++;
  }
}

describe('soak: random backend terminations under load', () => {
  it('the process survives, nothing leaks, every run is its viewer’s rows or coded', async () => {
    const uncaught = watchUncaught();
    const started = Date.now();
    const done = () => stats.runs >= TARGET_RUNS || Date.now() - started > MAX_MS;
    chaos = true;

    const runLoop = async () => {
      while (!done()) await oneRun(VIEWERS[Math.floor(Math.random() * VIEWERS.length)]!);
    };
    const terminator = async () => {
      while (!done()) {
        const backends = await libraryBackends(fx);
        const victim = backends[Math.floor(Math.random() * backends.length)];
        if (victim !== undefined) {
          await terminate(fx.sql, [victim.pid]);
          stats.terminated++;
        }
        await pause(5 + Math.random() * 20);
      }
    };
    const adminLoop = async () => {
      while (!done()) {
        try {
          await admin.admin.disableRole(WS, fx.APAC);
          await pause(Math.random() * 50);
          await admin.admin.enableRole(WS, fx.APAC);
        } catch {
          stats.adminFailures++; // its own connection was terminated too; tried again
        }
        await pause(Math.random() * 100);
      }
    };
    await Promise.all([...Array.from({ length: 8 }, runLoop), terminator(), adminLoop()]);
    chaos = false;
    const ms = Date.now() - started;

    // Quiet again: APAC enabled (a disable cut short is finished by repeating it first).
    await admin.admin.disableRole(WS, fx.APAC);
    const { generation } = await admin.admin.enableRole(WS, fx.APAC);
    await Promise.all([runner, admin].map((d) => d.waitForGeneration(generation)));

    // Nothing checked out: every login connection goes idle (the last DISCARD ALLs finish).
    await waitUntil('every login connection is idle', async () => {
      const logins = (await libraryBackends(fx)).filter((b) => b.app === 'viewer-cache');
      return logins.every((b) => b.state === 'idle');
    });
    const logins = (await libraryBackends(fx)).filter((b) => b.app === 'viewer-cache');
    expect(logins.length).toBeLessThanOrEqual(VIEWERS.length * POOL_SIZE);
    for (const viewer of VIEWERS) {
      expect((await run(onRunner, 'orders', viewer)).value).toEqual(ALLOWED[viewer]![0]);
    }
    console.info('soak:', { ...stats, ms });
    expect(stats.runs).toBeGreaterThanOrEqual(1000);
    // A coded error, but a hang: a run waited out the executor's timeout.
    expect(stats.errors['E_EXECUTOR_TIMEOUT']).toBeUndefined();
    expect(stats.terminated).toBeGreaterThan(100);
    expect(uncaught.errors).toEqual([]);
    expect(await within(runner.close(), 5_000)).not.toBe('timeout');
  }, 120_000);
});
