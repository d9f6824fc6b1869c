/**
 * The HTTP rows' client, in a process of its own (forked by `http_bench.ts`, which holds the
 * servers): a server's CPU time per request is then its own, and no row's client competes with
 * its server for one event loop. It runs one batch per message and answers with every
 * request's latency; a batch either completes or reports what went wrong (a status other than
 * 200, or a cache header other than the one expected).
 */
import { Agent, request } from 'node:http';

/** One batch: `conns` keep-alive connections, for `ops` requests or for `ms` (≥ `minOps`). */
export interface BatchRequest {
  readonly id: number;
  readonly port: number;
  readonly method: 'GET' | 'POST';
  readonly path: string;
  readonly body?: string;
  readonly token: string;
  /** The `x-viewer-cache` header every answer must carry (`hit`, `miss`), if any. */
  readonly expectCache?: string;
  /**
   * Every request a miss: the body's `args` are replaced by `{ b: id, n: i }` (the batch's id,
   * the request's number in it), so no two requests of one client share a cache key.
   */
  readonly vary?: boolean;
  readonly conns: number;
  readonly ops?: number;
  readonly ms?: number;
  readonly minOps?: number;
}

export interface BatchResult {
  readonly id: number;
  /** Each request's latency, µs, in completion order. */
  readonly latenciesUs: number[];
  readonly wallNs: number;
  readonly error?: string;
}

/** Keep-alive agents per (port, connections): connections stay warm across rounds. */
const agents = new Map<string, Agent>();

function agentFor(port: number, conns: number): Agent {
  const key = `${port}:${conns}`;
  let agent = agents.get(key);
  if (agent === undefined) {
    agent = new Agent({ keepAlive: true, maxSockets: conns });
    agents.set(key, agent);
  }
  return agent;
}

function send(batch: BatchRequest, agent: Agent, body: string | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    const headers: Record<string, string> = { authorization: `Bearer ${batch.token}` };
    if (batch.body !== undefined) headers['content-type'] = 'application/json';
    const req = request(
      {
        host: '127.0.0.1',
        port: batch.port,
        method: batch.method,
        path: batch.path,
        agent,
        headers,
      },
      (res) => {
        res.resume();
        res.on('error', reject);
        res.on('end', () => {
          const cache = res.headers['x-viewer-cache'];
          if (res.statusCode !== 200) {
            reject(new Error(`${batch.path}: answered ${res.statusCode}`));
          } else if (batch.expectCache !== undefined && cache !== batch.expectCache) {
            reject(
              new Error(`${batch.path}: x-viewer-cache ${String(cache)}, not ${batch.expectCache}`),
            );
          } else {
            resolve();
          }
        });
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function run(batch: BatchRequest): Promise<BatchResult> {
  const agent = agentFor(batch.port, batch.conns);
  const latenciesUs: number[] = [];
  const start = process.hrtime.bigint();
  const deadline = batch.ms === undefined ? 0n : start + BigInt(Math.round(batch.ms * 1e6));
  let issued = 0;
  const template =
    batch.vary && batch.body !== undefined ? (JSON.parse(batch.body) as object) : undefined;
  const bodyOf = (n: number) =>
    template === undefined ? batch.body : JSON.stringify({ ...template, args: { b: batch.id, n } });
  const more = () =>
    batch.ops !== undefined
      ? issued < batch.ops
      : process.hrtime.bigint() < deadline || issued < (batch.minOps ?? 1);
  try {
    await Promise.all(
      Array.from({ length: batch.conns }, async () => {
        while (more()) {
          const body = bodyOf(issued++);
          const t0 = process.hrtime.bigint();
          await send(batch, agent, body);
          latenciesUs.push(Number(process.hrtime.bigint() - t0) / 1000);
        }
      }),
    );
  } catch (err) {
    return { id: batch.id, latenciesUs, wallNs: 0, error: (err as Error).message };
  }
  return { id: batch.id, latenciesUs, wallNs: Number(process.hrtime.bigint() - start) };
}

process.on('message', (batch: BatchRequest) => {
  void run(batch).then((result) => process.send?.(result));
});
process.on('disconnect', () => {
  for (const agent of agents.values()) agent.destroy();
});
