import { afterEach, describe, expect, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { createExecutor, type Executor } from '../../../src/index.js';
import {
  app,
  canAuthenticate,
  type OrdersDb,
  ordersDb,
  pgRole,
  ROWS,
  roleLoginPasswords,
  runFor,
  setLoginRows,
  setLoginsHolding,
  WS,
} from '../../helpers/orders_db.js';

// SPEC invariants 6–8: one login per distinct set of roles, keyed by catalog ids — a rename moves
// nothing, a change of groups resolves to another login and leaves the old one alone; disabling
// or dropping a role retires every set login holding it; concurrent first use creates it once.

const CAROL = 'carol@example.com';
const ALICE = 'alice@example.com';

interface Who {
  user: string;
  ids: number[];
}

function executorFor(datatables: Datatables): Executor {
  return createExecutor({
    datatables,
    runnables: {
      whoami: {
        fn: async (_args, ctx) => {
          const client = await ctx.datatable('main', { as: 'viewer' });
          const user = (await client.query('select session_user::text as u')).rows[0]!['u'];
          const ids = (await client.query('select id from orders order by id')).rows.map(
            (r) => r['id'],
          );
          return { user, ids };
        },
      },
    },
  });
}

async function whoami(executor: Executor, viewer: string): Promise<Who> {
  return (await runFor(executor, 'whoami', app(viewer))).value as Who;
}

let fx: OrdersDb | undefined;
afterEach(async () => {
  await fx?.close();
  fx = undefined;
});

describe('set logins are keyed by catalog ids', () => {
  it('renaming a role keeps the same set login, for this process and a fresh one', async () => {
    fx = await ordersDb();
    const executor = executorFor(fx.datatables);
    const before = await whoami(executor, CAROL);
    expect(before.user).toMatch(/^wm_set_[0-9a-f]{32}$/);
    expect(before.ids).toEqual([1, 2, 3]);

    const renamed = `${fx.prefix}ventes_emea`;
    const change = await fx.datatables.admin.renameRole(WS, fx.EMEA, renamed);
    // Policies name roles as text: that part of a rename is the data table owner's job.
    await fx.sql.query(
      `alter policy emea on orders using (region = 'emea' and pg_has_role(current_user, '${renamed}', 'member'))`,
    );
    const fresh = executorFor(await fx.open({ migrate: false }));
    await fx.settle(change.generation);

    expect(await whoami(executor, CAROL)).toEqual(before);
    expect(await whoami(fresh, CAROL)).toEqual(before);
    expect(await whoami(executor, ALICE)).toEqual({ user: renamed, ids: ROWS['emea'] });
    const rows = await setLoginRows(fx.sql);
    expect(rows.map((row) => row.login)).toEqual([before.user]);
    expect(await setLoginsHolding(fx.sql, [renamed])).toEqual([
      { login: before.user, canLogin: true, memberOf: [fx.AMER, renamed].sort() },
    ]);
    expect(
      (await fx.datatables.listLogins()).map(({ login, roles }) => ({ login, roles })),
    ).toEqual([{ login: before.user, roles: expect.arrayContaining([renamed, fx.AMER]) }]);
  });

  it('a role’s own login, lent before and after its rename, is checked under its new name', async () => {
    // The leaser remembers what it derived for a role (its password, what to check after a
    // release) by catalog role object: a rename must not leave the old name watched.
    fx = await ordersDb();
    const executor = executorFor(fx.datatables);
    const checked = () =>
      new Promise<boolean>((resolve) => {
        const done = ({ repaired }: { repaired: boolean }) => {
          fx!.datatables.events.off('login:checked', done);
          resolve(repaired);
        };
        fx!.datatables.events.on('login:checked', done);
      });
    let check = checked();
    expect(await whoami(executor, ALICE)).toEqual({ user: fx.EMEA, ids: ROWS['emea'] });
    expect(await check).toBe(false);

    const renamed = `${fx.prefix}ventes_emea`;
    const change = await fx.datatables.admin.renameRole(WS, fx.EMEA, renamed);
    await fx.sql.query(
      `alter policy emea on orders using (region = 'emea' and pg_has_role(current_user, '${renamed}', 'member'))`,
    );
    await fx.settle(change.generation);
    check = checked();
    expect(await whoami(executor, ALICE)).toEqual({ user: renamed, ids: ROWS['emea'] });
    // Watched under the old name, the check would find no such login and "repair" it.
    expect(await check).toBe(false);
  });

  it('a change in the viewer’s groups resolves to another login; the old one is untouched', async () => {
    fx = await ordersDb();
    const executor = executorFor(fx.datatables);
    const old = await whoami(executor, CAROL);
    const [oldRow] = await setLoginRows(fx.sql);
    expect(oldRow!.login).toBe(old.user);

    await fx.datatables.admin.removeMembership(WS, CAROL, 'group', 'amer');
    const change = await fx.datatables.admin.addMembership(WS, CAROL, 'group', 'apac');
    await fx.settle(change.generation);

    const now = await whoami(executor, CAROL);
    expect(now.user).toMatch(/^wm_set_/);
    expect(now.user).not.toBe(old.user);
    expect(now.ids).toEqual([...ROWS['emea']!, ...ROWS['apac']!]);

    // The old login: still there, row unchanged, still a member of EMEA + AMER, still logs in.
    const rows = await setLoginRows(fx.sql);
    expect(rows.find((row) => row.login === old.user)).toEqual(oldRow);
    expect(rows).toHaveLength(2);
    expect(await pgRole(fx.sql, old.user)).toMatchObject({ canLogin: true });
    expect(await canAuthenticate(fx.db.name, old.user, oldRow!.password)).toBe(true);
    const holding = await setLoginsHolding(fx.sql, [fx.EMEA]);
    expect(holding.find((l) => l.login === old.user)?.memberOf).toEqual([fx.AMER, fx.EMEA].sort());
    expect(holding.find((l) => l.login === now.user)?.memberOf).toEqual([fx.APAC, fx.EMEA].sort());
  });
});

describe('disabling or dropping a role retires every set login holding it', () => {
  it('disable: rows and logins holding it gone, the role NOLOGIN; others untouched; enable again', async () => {
    fx = await ordersDb();
    const { admin } = fx.datatables;
    await admin.addMembership(WS, 'erin@example.com', 'group', 'emea');
    await admin.addMembership(WS, 'erin@example.com', 'group', 'apac');
    await admin.addMembership(WS, 'frank@example.com', 'group', 'amer');
    await fx.settle(
      (await admin.addMembership(WS, 'frank@example.com', 'group', 'apac')).generation,
    );
    const executor = executorFor(fx.datatables);
    // A second process that has the EMEA + AMER login's password cached and a pool open.
    const other = executorFor(await fx.open({ migrate: false }));

    const carol = (await whoami(executor, CAROL)).user;
    const erin = (await whoami(executor, 'erin@example.com')).user;
    const frank = (await whoami(executor, 'frank@example.com')).user;
    expect((await whoami(other, CAROL)).user).toBe(carol);
    const frankRow = (await setLoginRows(fx.sql)).find((row) => row.login === frank)!;
    const emeaPassword = (await roleLoginPasswords(fx.sql)).get(fx.EMEA)!;
    expect(await canAuthenticate(fx.db.name, fx.EMEA, emeaPassword)).toBe(true);

    const disabled = await admin.disableRole(WS, fx.EMEA);
    await fx.settle(disabled.generation);

    const rows = await setLoginRows(fx.sql);
    expect(rows.map((row) => row.login)).toEqual([frank]);
    expect(await pgRole(fx.sql, carol)).toBeNull();
    expect(await pgRole(fx.sql, erin)).toBeNull();
    expect(await setLoginsHolding(fx.sql, [fx.EMEA])).toEqual([]);
    // The role's own login is NOLOGIN: its password no longer opens a session.
    expect(await pgRole(fx.sql, fx.EMEA)).toMatchObject({ canLogin: false });
    expect(await canAuthenticate(fx.db.name, fx.EMEA, emeaPassword)).toBe(false);
    // Untouched: the login holding AMER + APAC only.
    expect(rows[0]).toEqual(frankRow);
    expect(await canAuthenticate(fx.db.name, frank, frankRow.password)).toBe(true);
    // Viewers now resolve without EMEA.
    await expect(whoami(executor, ALICE)).rejects.toMatchObject({ code: 'E_NO_ROLES' });
    expect(await whoami(executor, CAROL)).toEqual({ user: fx.AMER, ids: ROWS['amer'] });
    expect(await whoami(other, CAROL)).toEqual({ user: fx.AMER, ids: ROWS['amer'] });
    expect((await whoami(executor, 'erin@example.com')).user).toBe(fx.APAC);

    const enabled = await admin.enableRole(WS, fx.EMEA);
    await fx.settle(enabled.generation);
    expect(await whoami(executor, ALICE)).toEqual({ user: fx.EMEA, ids: ROWS['emea'] });
    expect(await canAuthenticate(fx.db.name, fx.EMEA, emeaPassword)).toBe(true);
    // Same set, same name: recreated on first use, with a new secret.
    expect(await whoami(executor, CAROL)).toEqual({ user: carol, ids: [1, 2, 3] });
    // The other process still had the old password cached: it re-reads the row and connects.
    expect(await whoami(other, CAROL)).toEqual({ user: carol, ids: [1, 2, 3] });
    const carolRow = (await setLoginRows(fx.sql)).find((row) => row.login === carol)!;
    expect(await canAuthenticate(fx.db.name, carol, carolRow.password)).toBe(true);
  });

  it('drop: the role, its catalog row and every set login holding it are gone', async () => {
    fx = await ordersDb();
    const { admin } = fx.datatables;
    const executor = executorFor(fx.datatables);
    const carol = (await whoami(executor, CAROL)).user;
    const amerOid = (await pgRole(fx.sql, fx.AMER))!.oid;

    const dropped = await admin.dropRole(WS, fx.AMER);
    // The policy named the role as text; it is the owner's to remove.
    await fx.sql.query('drop policy amer on orders');
    await fx.settle(dropped.generation);

    expect(await pgRole(fx.sql, fx.AMER)).toBeNull();
    expect(await pgRole(fx.sql, carol)).toBeNull();
    expect(await setLoginRows(fx.sql)).toEqual([]);
    expect((await admin.listRoles(WS)).map((role) => role.name)).not.toContain(fx.AMER);
    expect(
      (await fx.sql.query('select 1 from viewer_cache.role where oid = $1', [amerOid])).rowCount,
    ).toBe(0);
    expect(await whoami(executor, CAROL)).toEqual({ user: fx.EMEA, ids: ROWS['emea'] });
    await expect(whoami(executor, 'bob@example.com')).rejects.toMatchObject({ code: 'E_NO_ROLES' });
  });
});

describe('concurrent first use', () => {
  it('five processes connect as the same new set at once: all succeed, one login, one row', async () => {
    fx = await ordersDb();
    const GINA = 'gina@example.com';
    const { admin } = fx.datatables;
    for (const group of ['emea', 'amer']) await admin.addMembership(WS, GINA, 'group', group);
    const last = await admin.addMembership(WS, GINA, 'group', 'apac');
    const processes = await Promise.all(
      Array.from({ length: 5 }, () => fx!.open({ migrate: false })),
    );
    await fx.settle(last.generation);
    let created = 0;
    let takenBack = 0;
    for (const datatables of processes) {
      datatables.events.on('login:created', () => created++);
      datatables.events.on('login:taken-back', () => takenBack++);
    }
    const executors = processes.map(executorFor);

    const results = await Promise.all(
      executors.flatMap((executor) => [whoami(executor, GINA), whoami(executor, GINA)]),
    );

    const login = results[0]!.user;
    expect(login).toMatch(/^wm_set_/);
    for (const result of results) expect(result).toEqual({ user: login, ids: [1, 2, 3, 4] });
    expect({ created, takenBack }).toEqual({ created: 1, takenBack: 0 });
    const holdingAll = (await setLoginsHolding(fx.sql, [fx.APAC])).filter(
      (l) => l.memberOf.length === 3,
    );
    expect(holdingAll).toEqual([
      { login, canLogin: true, memberOf: [fx.AMER, fx.APAC, fx.EMEA].sort() },
    ]);
    const rows = (await setLoginRows(fx.sql)).filter((row) => row.login === login);
    expect(rows).toHaveLength(1);
    expect(await canAuthenticate(fx.db.name, login, rows[0]!.password)).toBe(true);
  });
});

describe('reserved names', () => {
  it('a role cannot be created or renamed to admin, a wm_set_ name or the viewer marker', async () => {
    fx = await ordersDb();
    const { admin } = fx.datatables;
    for (const name of ['admin', 'wm_set_00', '@viewer', 'pg_x']) {
      await expect(admin.createRole(WS, 'main', name)).rejects.toMatchObject({
        code: 'E_INVALID_ROLE_NAME',
      });
      await expect(admin.renameRole(WS, fx.EMEA, name)).rejects.toMatchObject({
        code: 'E_INVALID_ROLE_NAME',
      });
    }
  });
});
