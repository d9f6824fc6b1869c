import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CATALOG_CHANNEL } from '../../../src/datatable/catalog/migrations.js';
import {
  ACK_CHANNEL,
  HOLD_LISTENER_LOCK,
} from '../../../src/datatable/catalog/propagation_acks.js';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { type OrdersDb, ordersDb, WS } from '../../helpers/orders_db.js';
import { waitUntil } from '../../helpers/wait.js';

// Propagation acknowledgements are authenticated (a MAC under a key derived from the secret,
// bound to the sending backend and the generation), and a listener never echoes a generation
// it has not read. Watched failing on the old code: the forger was counted (acknowledged 3,
// missing 0), and every listener echoed the forged 999999999 on the ack channel.

const ALICE = 'alice@example.com';
const FORGED = 999_999_999;

let fx: OrdersDb;
let reader: Datatables;
let writer: Datatables;
const clients: pg.Client[] = [];

async function connect(): Promise<pg.Client> {
  const client = new pg.Client({ connectionString: fx.db.url });
  client.on('error', () => {});
  await client.connect();
  clients.push(client);
  return client;
}

beforeAll(async () => {
  fx = await ordersDb();
  reader = await fx.open({ migrate: false });
  // The wait's bound (heartbeat + timeout) long enough that genuine acknowledgements come
  // within it on a busy machine.
  writer = await fx.open({
    migrate: false,
    catalog: { awaitPropagation: true, heartbeat: '2s', heartbeatTimeout: '3s' },
  });
  await waitUntil(
    'every listener is up',
    () => fx.datatables.listenerUp && reader.listenerUp && writer.listenerUp,
  );
});

afterAll(async () => {
  await Promise.allSettled(clients.map((client) => client.end()));
  await fx?.close();
});

describe('propagation acknowledgements are authenticated', () => {
  it('a session that joins the listener lock and acknowledges without the key is not counted', async () => {
    // The forger: any login that can connect takes the lock and acknowledges every change at
    // once, in the old format and in the new one with a made-up MAC.
    const forger = await connect();
    await forger.query(HOLD_LISTENER_LOCK);
    forger.on('notification', (message) => {
      if (message.channel !== CATALOG_CHANNEL) return;
      const generation = message.payload ?? '';
      void forger
        .query('select pg_notify($1, $2), pg_notify($1, $3)', [
          ACK_CHANNEL,
          generation,
          `${generation} ${'A'.repeat(43)}`,
        ])
        .catch(() => {});
    });
    await forger.query(`listen ${CATALOG_CHANNEL}`);

    const { generation } = await writer.admin.addMembership(WS, ALICE, 'group', 'apac');
    const result = await writer.awaitPropagation(generation);
    // The two genuine processes (the fixture's and the reader), not the forger: it is waited
    // for to the bound, like a process that said nothing.
    expect({ acknowledged: result.acknowledged, missing: result.missing }).toEqual({
      acknowledged: 2,
      missing: 1,
    });
    await forger.end();
  }, 30_000);

  it('a generation anyone NOTIFYs is never echoed as acknowledged', async () => {
    const watcher = await connect();
    const acks = new Map<number, string>();
    watcher.on('notification', (message) => {
      if (message.channel === ACK_CHANNEL) acks.set(message.processId, message.payload ?? '');
    });
    await watcher.query(`listen ${ACK_CHANNEL}`);
    const outsider = await connect();
    await outsider.query('select pg_notify($1, $2)', [CATALOG_CHANNEL, String(FORGED)]);
    // Each of the three processes reads the generation again and acknowledges what it read.
    await waitUntil('three listeners acknowledged', () => acks.size >= 3);
    const { rows } = await fx.sql.query<{ value: string }>(
      'select value from viewer_cache.generation',
    );
    const current = Number(rows[0]?.value);
    for (const payload of acks.values()) {
      const acknowledged = Number(payload.split(' ')[0]);
      expect(acknowledged).toBeLessThanOrEqual(current);
      expect(payload).toMatch(/^\d+ [A-Za-z0-9_-]{43}$/);
    }
  }, 30_000);
});
