import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import type { RunnableDefinition } from '../../../src/index.js';
import { app, type OrdersDb, ordersDb, runFor } from '../../helpers/orders_db.js';
import { QueueDeployment } from '../../helpers/queue_fixture.js';

// SPEC invariant 22 through queue mode: the server answers hits from Redis and enqueues misses,
// a worker (with its own catalog snapshot) runs them and stores the result under its own
// fingerprint check. A policy tightened behind the library makes the server's next lookup miss,
// the worker's run reflects the new rule, and an entry that did not touch the data table stays.

const ALICE = 'alice@example.com';

let fx: OrdersDb;
let worker: Datatables;
let deploy: QueueDeployment;
let executions = 0;

const runnables: Record<string, RunnableDefinition> = {
  report: {
    cacheTtlS: 300,
    fn: async (_args, ctx) => {
      executions++;
      const client = await ctx.datatable('main', { as: 'viewer' });
      return (await client.query('select id from orders order by id')).rows.map((r) => r['id']);
    },
  },
  constant: { cacheTtlS: 300, fn: async () => 42 },
};

beforeAll(async () => {
  fx = await ordersDb();
  worker = await fx.open({ migrate: false });
  deploy = new QueueDeployment(inject('redisUrl'), fx.db.url, worker, runnables);
  await deploy.migrate();
});

afterAll(async () => {
  await deploy?.close();
  await fx?.close();
});

describe('a rule change through queue mode', () => {
  it("alter policy: the server's next lookup misses, the worker's run reflects it; an entry that never leased keeps hitting", async () => {
    const server = await deploy.server();
    await deploy.worker();
    const run = async (path: string) => {
      const result = await runFor(server.registry, path, app(ALICE), { through: server.cached });
      return { fromCache: result.fromCache, value: result.value };
    };
    await run('report');
    await run('constant');
    expect(await run('report')).toEqual({ fromCache: true, value: [1, 3] });
    expect(await run('constant')).toEqual({ fromCache: true, value: 42 });

    await fx.sql.query(
      `alter policy emea on orders using (region = 'emea' and id > 1 and pg_has_role(current_user, '${fx.EMEA}', 'member'))`,
    );
    const { rows } = await fx.sql.query('select value from viewer_cache.generation');
    await fx.settle(Number(rows[0]!['value']));

    const before = executions;
    expect(await run('report')).toEqual({ fromCache: false, value: [3] });
    expect(executions).toBe(before + 1);
    expect(await run('report')).toEqual({ fromCache: true, value: [3] });
    expect(await run('constant')).toEqual({ fromCache: true, value: 42 });
  });
});
