/**
 * The load client of `http_process.ts`, in a process of its own: `conns` keep-alive
 * connections each send the cached request back to back for `seconds`, then one JSON line with
 * the count, req/s and the latencies this client saw. Any answer but a 200 fails the run.
 */
import { Agent, request } from 'node:http';

const [base, token, path, secondsArg, connsArg] = process.argv.slice(2);
if (base === undefined || token === undefined || path === undefined) {
  console.error('usage: http_load.ts <base url> <token> <path> [seconds=5] [conns=8]');
  process.exit(2);
}
const seconds = Number(secondsArg ?? 5);
const conns = Number(connsArg ?? 8);
const { port } = new URL(base);
const agent = new Agent({ keepAlive: true, maxSockets: conns });
const body = JSON.stringify({ path: 'f/orders/list' });
const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };

const one = () =>
  new Promise<void>((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port, method: 'POST', path, agent, headers },
      (res) => {
        res.resume();
        res.on('end', () =>
          res.statusCode === 200 ? resolve() : reject(new Error(`answered ${res.statusCode}`)),
        );
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });

const latencies: number[] = [];
const until = Date.now() + seconds * 1000;
const started = process.hrtime.bigint();
await Promise.all(
  Array.from({ length: conns }, async () => {
    while (Date.now() < until) {
      const t0 = process.hrtime.bigint();
      await one();
      latencies.push(Number(process.hrtime.bigint() - t0) / 1000);
    }
  }),
);
const wallS = Number(process.hrtime.bigint() - started) / 1e9;
const sorted = Float64Array.from(latencies).sort();
const at = (p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
console.log(
  JSON.stringify({
    requests: latencies.length,
    reqPerSec: latencies.length / wallS,
    p50Us: at(0.5),
    p99Us: at(0.99),
  }),
);
agent.destroy();
