import { Cluster } from 'ioredis';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import type { RunnableDefinition } from '../../../src/index.js';
import { routedQueueName } from '../../../src/queue/queue_names.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, WS } from '../../helpers/orders_db.js';
import { QueueDeployment } from '../../helpers/queue_fixture.js';
import { type RedisClusterHandle, startRedisCluster } from '../../helpers/redis_cluster.js';

// Jobs on workers on a real 3-master Redis Cluster: the hash-tagged prefix keeps every key of
// the queue in one slot (BullMQ's scripts need it), and nothing readable lands on any master.

const ALICE = 'alice@example.com';
const BOB = 'bob@example.com';

let fx: OrdersDb;
let datatables: Datatables;
let cluster: RedisClusterHandle;
let client: Cluster;
let deploy: QueueDeployment;

const runnables: Record<string, RunnableDefinition> = {
  report: {
    cacheTtlS: 300,
    fn: async (_args, ctx) => {
      const c = await ctx.datatable('main', { as: 'viewer' });
      return (await c.query('select id from orders order by id')).rows.map((r) => r['id']);
    },
  },
};

beforeAll(async () => {
  cluster = await startRedisCluster();
  // BullMQ's blocking reads need a client that retries forever.
  client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: null } });
  client.on('error', () => {});
  fx = await ordersDb();
  datatables = await fx.open({ migrate: false });
  deploy = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, runnables, client);
  await deploy.migrate();
}, 90_000);

afterAll(async () => {
  await deploy?.close();
  client?.disconnect();
  await cluster?.stop();
  await fx?.close();
});

describe('jobs on workers on a Redis Cluster', () => {
  it('each viewer gets their own rows, the second run is a hit, nothing readable is kept', async () => {
    const server = await deploy.server();
    await deploy.worker();
    const queue = routedQueueName('jobs', WS, 'default');
    const mark = await deploy.eventsEnd(queue);
    for (const [viewer, rows] of [
      [ALICE, ROWS['emea']],
      [BOB, ROWS['amer']],
    ] as const) {
      const miss = await runFor(server.registry, 'report', app(viewer), { through: server.cached });
      expect(miss.value).toEqual(rows);
      expect(miss.fromCache).toBe(false);
      const hit = await runFor(server.registry, 'report', app(viewer), { through: server.cached });
      expect(hit.value).toEqual(rows);
      expect(hit.fromCache).toBe(true);
    }
    // Everything the two misses leave, their completed events too (a reply may come first).
    await deploy.completedSince(queue, mark, 2);
    const dump = await deploy.dump();
    expect([...dump.keys()].some((key) => key.startsWith(deploy.prefix))).toBe(true);
    const text = [...dump].map(([k, v]) => `${k}\n${v}`).join('\n');
    for (const needle of [ALICE, BOB, '[1,3]']) expect(text).not.toContain(needle);
  }, 60_000);
});
