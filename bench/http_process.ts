/**
 * `npx tsx bench/http_process.ts <floor|cached> [seconds=5] [conns=8]`: one HTTP route served
 * alone, with its load client in a process of its own (`http_client.ts`), as in production. It
 * reports the client's req/s and latencies, and the server process's CPU time per request (both
 * servers are started in it; the one not measured stays idle).
 *
 * - `floor`: the minimal Fastify route doing one `getBuffer` of the cached response's bytes;
 * - `cached`: the reference server's app request, a cache hit (`VIEWER_CACHE_MEMORY_TIER_BYTES=0`
 *   for Redis only; two tiers otherwise, the server's default).
 *
 * Beside `http_bench.ts` (short interleaved rounds of every row, in `npm run bench`): one route
 * under a steady load for as long as asked, for profiling or A/B runs of a change. Alternate
 * `floor` and `cached` runs on one checkout and compare.
 */
import { fmt } from './helpers.js';
import {
  APP_RUN,
  firstRun,
  floorServer,
  HttpClient,
  LIST,
  startBenchServer,
} from './http_bench.js';
import { benchPostgres } from './postgres_fixture.js';

const which = process.argv[2];
if (which !== 'floor' && which !== 'cached') {
  console.error('usage: http_process.ts <floor|cached> [seconds=5] [conns=8]');
  process.exit(2);
}
const seconds = Number(process.argv[3] ?? 5);
const conns = Number(process.argv[4] ?? 8);
const redisUrl = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';

const prefix = `vchp${process.pid}_`;
const postgres = await benchPostgres();
const { server, token } = await startBenchServer(
  postgres,
  prefix,
  redisUrl,
  `vc-bench-httpp-${process.pid}:`,
);
const floor = await floorServer(redisUrl, `vc-bench-httpp-${process.pid}:floor`);
const client = await HttpClient.start();
try {
  // The floor serves the very bytes a cached request answers with; this first request also
  // fills the cache.
  await floor.store(await firstRun(server.url, token));
  const target =
    which === 'floor'
      ? { port: Number(new URL(floor.url).port), path: '/floor' }
      : { port: Number(new URL(server.url).port), path: APP_RUN, expectCache: 'hit' };
  const load = (ms: number) =>
    client.batch({ ...target, method: 'POST', body: LIST, token, conns, ms });
  await load(1000); // warm-up
  const before = process.cpuUsage();
  const { latenciesUs, wallNs } = await load(seconds * 1000);
  const cpu = process.cpuUsage(before);
  const requests = latenciesUs.length;
  const sorted = Float64Array.from(latenciesUs).sort();
  const tier = process.env['VIEWER_CACHE_MEMORY_TIER_BYTES'] === '0' ? 'Redis only' : 'two tiers';
  console.log(
    `${which === 'floor' ? 'floor' : `cached (${tier})`}, ${conns} conns: ` +
      `${fmt((requests * 1e9) / wallNs, 0)} req/s, p50 ${fmt(sorted[requests >> 1]!)} µs, ` +
      `p99 ${fmt(sorted[Math.floor(requests * 0.99)]!)} µs, ` +
      `server CPU ${fmt((cpu.user + cpu.system) / requests)} µs/req ` +
      `(user ${fmt(cpu.user / requests)}, system ${fmt(cpu.system / requests)})`,
  );
} finally {
  client.close();
  await floor.close();
  await server.close();
  await postgres.close(prefix);
}
process.exit(0);
