import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import pg from 'pg';
import { describe, expect, inject, it } from 'vitest';
import { createDatatables } from '../../../src/index.js';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { createTestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { KINDS, propagationScene } from '../../helpers/propagation.js';
import { startRedisCluster } from '../../helpers/redis_cluster.js';
import { ServerFleet } from '../../helpers/server_fleet.js';
import {
  clearRedisPrefix,
  httpRequest,
  isRecord,
  runCliJson,
} from '../../helpers/server_process.js';

// Many processes, one truth (issue 10 §4): reference servers started together on one database,
// sharing one Redis (or a Redis Cluster), see each other's catalog and entitlement changes.
// Correctness only here (every change is eventually reflected everywhere; no run started after
// the stated bound serves the old state); bench/propagation_bench.ts measures how long it takes.

const ALICE = 'alice@example.com';
/** Rounds of "three servers start together on a fresh database". */
const STARTUP_ROUNDS = Number(process.env['VC_TEST_STARTUP_ROUNDS'] ?? 5);
/** Changes per kind and direction (the bench does ≥ 30). */
const TRIALS = Number(process.env['VC_TEST_PROPAGATION_TRIALS'] ?? 2);
/**
 * The stated bound: a change reaches every process within heartbeat + timeout
 * (docs/several-processes.md).
 */
const BOUND_MS = 2000;

async function aliceRows(url: string, secretKey: string): Promise<unknown> {
  const answer = await httpRequest(url, 'POST', '/api/w/demo/apps/orders-dashboard/run', {
    token: demoToken(secretKey, ALICE),
    body: { path: 'f/orders/list' },
  });
  expect(answer.status, answer.text).toBe(200);
  const result = isRecord(answer.json) ? answer.json['result'] : undefined;
  return (result as { id: number }[]).map((row) => row.id);
}

describe('three servers started together on a fresh database', () => {
  it(
    `all become ready and serve (${STARTUP_ROUNDS} rounds)`,
    async () => {
      for (let round = 0; round < STARTUP_ROUNDS; round++) {
        const prefix = uniquePrefix();
        // Empty: the catalog and server migrations, the demo's roles, schema and policies are
        // all made by whichever server gets there first, with the other two racing it.
        const db = await createTestDatabase(prefix, { empty: true });
        const secretKey = randomBytes(32).toString('hex');
        let fleet: ServerFleet | undefined;
        try {
          fleet = await ServerFleet.start({ databaseUrl: db.url, prefix, secretKey });
          for (const url of fleet.urls) expect(await aliceRows(url, secretKey)).toEqual([1, 3]);
          // Memberships are seeded once, not three times: the orders demo's one admin membership
          // and four group ones, and the clinics demo's seven (Dana is in two groups).
          const c = new pg.Client({ connectionString: db.url });
          await c.connect();
          const { rows } = await c.query('select count(*)::int as n from viewer_cache.membership');
          await c.end();
          expect(rows[0].n).toBe(12);
        } finally {
          await fleet?.stop();
          await db.drop();
        }
      }
    },
    60_000 * STARTUP_ROUNDS,
  );
});

describe('the same role created by two processes at once', () => {
  // createRole is idempotent for a role the same catalog made with the same definition: the
  // second process gets that role, or, when it lost the race mid-statement, E_CATALOG.
  it('one creates it; the other gets the same role or E_CATALOG (never a raw 23505)', async () => {
    const prefix = uniquePrefix();
    const db = await createTestDatabase(prefix);
    const secretKey = randomBytes(32).toString('hex');
    const [a, b] = await Promise.all(
      [0, 1].map(() => createDatatables({ connection: db.url, secretKey })),
    );
    try {
      await a!.admin.createDatatable('demo', 'main', { database: db.name });
      for (let i = 0; i < 3; i++) {
        const name = `${prefix}twice${i}`;
        const outcomes = await Promise.allSettled(
          [a!, b!].map((d) => d.admin.createRole('demo', 'main', name)),
        );
        expect(outcomes.filter((o) => o.status === 'fulfilled').length).toBeGreaterThanOrEqual(1);
        for (const outcome of outcomes) {
          if (outcome.status === 'rejected') {
            expect(outcome.reason).toMatchObject({
              code: 'E_CATALOG',
              message: expect.stringContaining('already exists'),
            });
          }
        }
        const roles = await a!.admin.listRoles('demo');
        expect(roles.filter((r) => r.name === name)).toHaveLength(1);
      }
    } finally {
      await Promise.all([a?.close(), b?.close()]);
      await db.drop();
    }
  });
});

async function propagationOn(redisUrl: string | undefined, redisPrefix: string) {
  const prefix = uniquePrefix();
  const db = await createTestDatabase(prefix);
  const secretKey = randomBytes(32).toString('hex');
  const fleet = await ServerFleet.start({
    databaseUrl: db.url,
    prefix,
    secretKey,
    ...(redisUrl === undefined ? {} : { redisUrl, redisPrefix }),
  });
  // The admin process waits for acknowledgements, as the CLI does: from its return on, no run
  // anywhere may answer the old state (entitlement rows are written by a plain connection, so
  // for them the stated bound applies).
  const scene = await propagationScene(fleet, {
    databaseUrl: db.url,
    prefix,
    secretKey,
    awaitPropagation: true,
  });
  try {
    // One LISTEN connection per server process, named with its pid.
    const { rows } = await scene.sql.query<{ name: string; n: number }>(
      `select application_name as name, count(*)::int as n from pg_stat_activity
        where datname = current_database() and application_name like 'viewer-cache-listener %'
        group by 1 order by 1`,
    );
    expect(rows).toEqual(
      fleet.servers
        .map((server) => ({ name: `viewer-cache-listener ${server.pid}`, n: 1 }))
        .sort((a, b) => a.name.localeCompare(b.name)),
    );
    // The CLI lists the table it declared.
    const listed = await runCliJson<{ table: string; viewerColumn: string }[]>(fleet.cliEnv, [
      'governing',
      'list',
    ]);
    expect(listed).toContainEqual({
      datatable: 'main',
      table: 'demo.entitlement',
      viewerColumn: 'email',
    });
    for (const kind of KINDS) {
      for (let trial = 0; trial < TRIALS; trial++) {
        for (const direction of ['revoke', 'restore'] as const) {
          const sample = await scene.measure(kind, direction, BOUND_MS);
          expect(sample.perServerMs, `${kind} ${direction}`).toHaveLength(fleet.urls.length);
          expect(sample.staleAfterBound, `${kind} ${direction}: stale after the bound`).toBe(0);
          // A plain connection's write (a row, a policy): the stated bound, not the return.
          if (kind !== 'entitlement' && kind !== 'policy') {
            expect(sample.staleAfterConfirm, `${kind} ${direction}: stale after return`).toBe(0);
          }
        }
      }
    }
  } finally {
    await scene.close();
    await fleet.stop();
    await db.drop();
  }
}

describe('a change made through one process reaches every other process', () => {
  it('three servers on one Redis: role, membership, tenant, entitlement-row and policy (DDL) changes', async () => {
    const redisPrefix = `vc-test:many:${randomBytes(4).toString('hex')}:`;
    const redis = new Redis(inject('redisUrl'), { lazyConnect: true });
    redis.on('error', () => {});
    try {
      await propagationOn(inject('redisUrl'), redisPrefix);
    } finally {
      await clearRedisPrefix(redis, redisPrefix).catch(() => {});
      redis.disconnect();
    }
  }, 240_000);

  it('three servers on a 3-master Redis Cluster (REDIS_URL lists the nodes)', async () => {
    const cluster = await startRedisCluster();
    try {
      const nodes = cluster.nodes.map((node) => `${node.host}:${node.port}`).join(',');
      await propagationOn(nodes, 'vc-test:many-cluster:');
    } finally {
      await cluster.stop();
    }
  }, 240_000);
});
