import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import { afterEach, describe, expect, inject, it } from 'vitest';
import { createTestDatabase, type TestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { redisAddress } from '../../helpers/redis.js';
import { type RedisClusterHandle, startRedisCluster } from '../../helpers/redis_cluster.js';
import { ServerFleet } from '../../helpers/server_fleet.js';
import { httpRequest, isRecord } from '../../helpers/server_process.js';
import { TcpProxy } from '../../helpers/tcp_proxy.js';
import { waitUntil } from '../../helpers/wait.js';

// /readyz tells a load balancer whether runs can be cached: it reflects the Redis tier's real
// state. On a Cluster, a PING to one node answers while the Cluster refuses writes (a master down,
// its slots uncovered): readiness asks every master for cluster_state instead.

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const step of cleanup.splice(0).reverse()) await step().catch(() => {});
});

async function serverOn(redisUrl: string): Promise<string> {
  const prefix = uniquePrefix();
  const db: TestDatabase = await createTestDatabase(prefix);
  cleanup.push(() => db.drop());
  const fleet = await ServerFleet.start({
    databaseUrl: db.url,
    prefix,
    secretKey: randomBytes(32).toString('hex'),
    redisUrl,
    redisPrefix: `vc-test:readyz:${prefix}`,
    count: 1,
    // A node that hangs is 'down' after this long; one that refuses, at once.
    env: { VIEWER_CACHE_REDIS_TIMEOUT_MS: '1000' },
  });
  cleanup.push(() => fleet.stop());
  return fleet.urls[0]!;
}

async function readiness(url: string): Promise<{ status: number; redis: unknown }> {
  const answer = await httpRequest(url, 'GET', '/readyz');
  const checks = isRecord(answer.json) ? answer.json['checks'] : undefined;
  return { status: answer.status, redis: isRecord(checks) ? checks['redis'] : undefined };
}

/** Polls /readyz until it answers `status`; resolves to the last answer. */
async function readinessBecomes(url: string, status: number) {
  let last = await readiness(url);
  await waitUntil(
    `/readyz answers ${status}`,
    async () => {
      last = await readiness(url);
      return last.status === status;
    },
    20_000,
  );
  return last;
}

/** Polls until /readyz and /api/cache/stats both report the invalidation bus as `state`. */
async function busBecomes(url: string, state: 'confirmed' | 'unconfirmed') {
  await waitUntil(
    `the invalidation bus is ${state}`,
    async () => {
      const ready = await httpRequest(url, 'GET', '/readyz');
      const stats = await httpRequest(url, 'GET', '/api/cache/stats');
      return (
        isRecord(ready.json) &&
        ready.json['invalidations'] === state &&
        isRecord(stats.json) &&
        stats.json['invalidationBus'] === state
      );
    },
    20_000,
  );
}

describe('/readyz on a 3-master Redis Cluster', () => {
  let cluster: RedisClusterHandle;

  it('is 503 with the Cluster state while a master is down, and 200 again once it is back', async () => {
    cluster = await startRedisCluster();
    cleanup.push(() => cluster.stop());
    const url = await serverOn(cluster.nodes.map((n) => `${n.host}:${n.port}`).join(','));
    expect(await readiness(url)).toEqual({ status: 200, redis: 'ok' });
    await busBecomes(url, 'confirmed');

    await cluster.stopNode(0);
    // The surviving masters declare the Cluster failed once the node timeout (2 s) passes.
    const survivor = new Redis(cluster.nodes[1]!.port, '127.0.0.1', { lazyConnect: true });
    survivor.on('error', () => {});
    cleanup.push(async () => survivor.disconnect());
    await waitUntil(
      'the survivors say cluster_state:fail',
      async () => String(await survivor.call('CLUSTER', 'INFO')).includes('cluster_state:fail'),
      20_000,
    );
    // Not once by luck: every answer, while the Cluster is failed, is 503 with its state.
    for (let i = 0; i < 5; i++) {
      const answer = await readiness(url);
      expect(answer.status).toBe(503);
      expect(['down', 'fail']).toContain(answer.redis);
    }

    await cluster.startNode(0);
    await cluster.waitForOk();
    expect(await readinessBecomes(url, 200)).toEqual({ status: 200, redis: 'ok' });
  }, 90_000);
});

describe('/readyz on one Redis', () => {
  it('is 503 with redis: down while Redis refuses connections, and 200 once it is back', async () => {
    const { host, port, via } = redisAddress(inject('redisUrl'));
    const proxy = await TcpProxy.start({ host, port });
    cleanup.push(() => proxy.stop());
    const url = await serverOn(via(proxy.port));
    expect(await readiness(url)).toEqual({ status: 200, redis: 'ok' });

    await busBecomes(url, 'confirmed');

    await proxy.setMode('refuse');
    expect(await readinessBecomes(url, 503)).toEqual({ status: 503, redis: 'down' });
    // The invalidation bus's state, in /readyz and in the cache stats (`cache stats`).
    await busBecomes(url, 'unconfirmed');
    await proxy.setMode('forward');
    expect(await readinessBecomes(url, 200)).toEqual({ status: 200, redis: 'ok' });
    await busBecomes(url, 'confirmed');
  }, 60_000);
});
