/**
 * `npx tsx bench/http_process.ts <floor|cached> [seconds=5] [conns=8]`: one HTTP route served
 * alone, with its load client in a process of its own (`http_load.ts`), as in production. It
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
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fmt } from './helpers.js';
import { floorServer, startBenchServer } from './http_bench.js';
import { benchPostgres } from './postgres_fixture.js';

const which = process.argv[2];
if (which !== 'floor' && which !== 'cached') {
  console.error('usage: http_process.ts <floor|cached> [seconds=5] [conns=8]');
  process.exit(2);
}
const seconds = Number(process.argv[3] ?? 5);
const conns = Number(process.argv[4] ?? 8);
const LOAD = join(dirname(fileURLToPath(import.meta.url)), 'http_load.ts');
const APP_RUN = '/api/w/demo/apps/orders-dashboard/run';
const redisUrl = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';

interface Load {
  requests: number;
  reqPerSec: number;
  p50Us: number;
  p99Us: number;
}

/** Runs the load client against `base` + `path`; resolves with its report. */
function load(base: string, token: string, path: string, s: number): Promise<Load> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [...process.execArgv, LOAD, base, token, path, String(s), String(conns)],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString('utf8');
    });
    child.on('error', reject);
    child.on('exit', (code) =>
      code === 0
        ? resolve(JSON.parse(out) as Load)
        : reject(new Error(`load client exited ${code}`)),
    );
  });
}

const prefix = `vchp${process.pid}_`;
const postgres = await benchPostgres();
const { server, token } = await startBenchServer(
  postgres,
  prefix,
  redisUrl,
  `vc-bench-httpp-${process.pid}:`,
);
const floor = await floorServer(redisUrl, `vc-bench-httpp-${process.pid}:floor`);
try {
  // The floor serves the very bytes a cached request answers with; this first request also
  // fills the cache.
  const first = await fetch(new URL(APP_RUN, server.url), {
    method: 'POST',
    headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
    body: JSON.stringify({ path: 'f/orders/list' }),
  });
  await floor.store(Buffer.from(await first.arrayBuffer()));
  const [base, path] = which === 'floor' ? [floor.url, '/floor'] : [server.url, APP_RUN];
  await load(base, token, path, 1); // warm-up
  const before = process.cpuUsage();
  const result = await load(base, token, path, seconds);
  const cpu = process.cpuUsage(before);
  const tier = process.env['VIEWER_CACHE_MEMORY_TIER_BYTES'] === '0' ? 'Redis only' : 'two tiers';
  console.log(
    `${which === 'floor' ? 'floor' : `cached (${tier})`}, ${conns} conns: ` +
      `${fmt(result.reqPerSec, 0)} req/s, p50 ${fmt(result.p50Us)} µs, p99 ${fmt(result.p99Us)} µs, ` +
      `server CPU ${fmt((cpu.user + cpu.system) / result.requests)} µs/req ` +
      `(user ${fmt(cpu.user / result.requests)}, system ${fmt(cpu.system / result.requests)})`,
  );
} finally {
  await floor.close();
  await server.close();
  await postgres.close(prefix);
}
process.exit(0);
