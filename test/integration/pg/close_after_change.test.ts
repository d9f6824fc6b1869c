import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { captureLogger } from '../../helpers/log_capture.js';
import { type OrdersDb, ordersDb, WS } from '../../helpers/orders_db.js';

// close() right after an admin change, as the CLI does after every `roles` / `groups` command:
// the change's own NOTIFY comes back to this process's listener and starts a generation check
// (and maybe a reload) on the admin pool while close() is ending it. close() must wait for that
// work or stop it, and say nothing: no "catalog reload failed: Cannot use a pool after calling end
// on the pool", nor any other line.

let fx: OrdersDb;

beforeAll(async () => {
  fx = await ordersDb();
});

afterAll(async () => {
  await fx?.close();
});

describe('close() right after an admin change', () => {
  it('waits for the reload its own NOTIFY started, and logs nothing', async () => {
    const lines: Record<string, unknown>[] = [];
    for (let i = 0; i < 16; i++) {
      const { logger, lines: logged } = captureLogger();
      const datatables = await fx.open({ logger, catalog: { awaitPropagation: i % 2 === 0 } });
      const email = `closer${i}@example.com`;
      await datatables.admin.addMembership(WS, email, 'group', 'emea');
      await datatables.close();
      // Whatever was still in flight has settled by now (a later line is a line close() let go).
      await new Promise((resolve) => setImmediate(resolve));
      lines.push(...logged().filter((line) => Number(line['level']) >= 40));
    }
    expect(lines).toEqual([]);
  });

  it('after close, a notification or a read starts nothing', async () => {
    const { logger, lines } = captureLogger();
    const datatables = await fx.open({ logger });
    // A burst of changes by another process: notifications arriving as this one closes.
    const changes = Array.from({ length: 8 }, (_, i) =>
      fx.datatables.admin.addMembership(WS, `burst${i}@example.com`, 'group', 'amer'),
    );
    await changes[0];
    await datatables.close();
    await Promise.all(changes);
    await new Promise((resolve) => setImmediate(resolve));
    expect(lines().filter((line) => Number(line['level']) >= 40)).toEqual([]);
  });
});
