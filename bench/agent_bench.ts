/**
 * Agent workers: `npx tsx bench/agent_bench.ts [--quick]` with REDIS_URL (and
 * DATABASE_URL, else an embedded PostgreSQL). Two reference servers in this process on the demo
 * world — one running misses in process, one with `VIEWER_CACHE_EXECUTION=agent` — and one or
 * two `viewer-cache worker --agent --demo` processes (no database credential); the HTTP client
 * runs in a process of its own (`http_client.ts`). Prints, as ratios within this run:
 * - a miss (an app request for `f/orders/list` with args never seen before) on an agent worker
 *   vs in process: added latency p50 / p99, over one keep-alive connection, interleaved;
 * - throughput of misses with 1 and 2 agent workers (`CONNS` connections);
 * - the hit path: the same cached request on both servers (a hit never reaches an agent).
 * Unlike `queue_bench.ts`, the runnable reads a data table: on the agent its statement goes
 * through the server's query proxy, which is part of what an agent's miss costs.
 * `--json`: the rows as one JSON line (`npm run bench` runs it so).
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { AgentTokens } from '../src/server/credentials/agent_tokens.js';
import {
  type ExecutionRow,
  executionRow,
  printExecutionRows,
  quantile,
} from './execution_report.js';
import { deleteRunKeys, REDIS_URL, RUN_PREFIX, rawRedis } from './fixtures.js';
import { BenchInvariantError } from './helpers.js';
import { APP_RUN, HttpClient, LIST, startBenchServer } from './http_bench.js';
import type { BatchRequest } from './http_client.js';
import { benchPostgres } from './postgres_fixture.js';

const MAIN = fileURLToPath(new URL('../src/server/main.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const GROUP = 'bench';
/** Connections of the throughput rows; each agent runs up to `AGENT_CONCURRENCY` jobs. */
const CONNS = 16;
const AGENT_CONCURRENCY = 8;
const quick = process.argv.includes('--quick');
const N = Number(process.env['AGENT_BENCH_N'] ?? (quick ? '60' : '200'));
const progress = (text: string) => process.stderr.write(text);

/** `worker --agent --demo`, with nothing in its environment but the agent's two variables. */
class BenchAgent {
  readonly #child: ChildProcess;
  readonly #finished: Promise<void>;
  constructor(serverUrl: string, agentToken: string, rolePrefix: string) {
    this.#child = spawn(
      process.execPath,
      [
        '--import',
        'tsx',
        MAIN,
        'worker',
        '--agent',
        '--demo',
        '--concurrency',
        String(AGENT_CONCURRENCY),
      ],
      {
        cwd: ROOT,
        env: {
          PATH: process.env['PATH'],
          HOME: process.env['HOME'],
          LOG_FORMAT: 'json',
          LOG_LEVEL: 'info',
          VIEWER_CACHE_DEMO_ROLE_PREFIX: rolePrefix,
          VIEWER_CACHE_SERVER_URL: serverUrl,
          VIEWER_CACHE_AGENT_TOKEN: agentToken,
        },
        stdio: ['ignore', 'pipe', 'inherit'],
      },
    );
    // Its first finished job: proof that it takes the group's jobs (its log line per job).
    this.#finished = new Promise((resolve, reject) => {
      const lines = createInterface({ input: this.#child.stdout! });
      lines.on('line', (line) => {
        if (line.includes('"job finished"')) resolve();
      });
      this.#child.once('exit', (code) => reject(new Error(`an agent worker exited (${code})`)));
    });
    this.#finished.catch(() => {});
  }

  /** Settles once this agent has finished a job. */
  tookAJob(): Promise<void> {
    return this.#finished;
  }

  async stop(): Promise<void> {
    if (this.#child.exitCode !== null) return;
    const exited = once(this.#child, 'exit');
    this.#child.kill('SIGTERM');
    await exited;
  }
}

const prefix = `vcab${process.pid}_`;
const postgres = await benchPostgres();
const redis = rawRedis();
const rows: ExecutionRow[] = [];
const agents: BenchAgent[] = [];
const closers: (() => Promise<void>)[] = [];
let client: HttpClient | undefined;
try {
  progress('agent: servers… ');
  const local = await startBenchServer(postgres, `${prefix}l`, REDIS_URL, `${RUN_PREFIX}al:`);
  closers.push(() => local.server.close());
  const agentPrefix = `${prefix}a`;
  const remote = await startBenchServer(postgres, agentPrefix, REDIS_URL, `${RUN_PREFIX}aa:`, {
    VIEWER_CACHE_EXECUTION: 'agent',
    VIEWER_CACHE_AGENT_GROUP: GROUP,
  });
  closers.push(() => remote.server.close());
  const pool = new pg.Pool({ connectionString: postgres.url(`${agentPrefix}http`), max: 1 });
  const agentToken = await new AgentTokens(pool).create('demo', GROUP, 'bench');
  await pool.end();
  const startAgent = () => {
    const agent = new BenchAgent(remote.server.url, agentToken, agentPrefix);
    agents.push(agent);
    return agent;
  };
  client = await HttpClient.start();
  const http = client;
  const port = (url: string) => Number(new URL(url).port);
  const target = (
    server: { server: { url: string }; token: string },
    expectCache: 'hit' | 'miss',
  ): Omit<BatchRequest, 'id' | 'conns'> => ({
    port: port(server.server.url),
    method: 'POST',
    path: APP_RUN,
    body: LIST,
    token: server.token,
    expectCache,
    vary: expectCache === 'miss',
  });
  const misses = [target(local, 'miss'), target(remote, 'miss')] as const;

  progress('agent worker… ');
  const first = startAgent();
  // Warm both servers (pools, prepared logins, the agent's proxy connection).
  for (const t of misses) await http.batch({ ...t, conns: 1, ops: 20 });
  await first.tookAJob();

  progress('misses… ');
  // Interleaved in rounds of 5 (in process, agent, in process, …): load falls on both alike.
  const lat: [number[], number[]] = [[], []];
  for (let r = 0; r < Math.ceil(N / 5); r++) {
    for (const [k, t] of misses.entries()) {
      lat[k]!.push(...(await http.batch({ ...t, conns: 1, ops: 5 })).latenciesUs);
    }
  }
  const [base, viaAgent] = lat.map((l) => l.map((us) => us / 1000).sort((a, b) => a - b)) as [
    number[],
    number[],
  ];
  for (const [label, q] of [
    ['p50', 0.5],
    ['p99', 0.99],
  ] as const) {
    rows.push(
      executionRow(
        `agent_miss_${label}`,
        `an app request's miss on an agent worker (HTTP, query proxied), ${label}`,
        'ms',
        'in process',
        quantile(base, q),
        quantile(viaAgent, q),
      ),
    );
  }

  progress('throughput… ');
  const rate = async (t: Omit<BatchRequest, 'id' | 'conns'>) => {
    const { wallNs } = await http.batch({ ...t, conns: CONNS, ops: N * 2 });
    return (N * 2 * 1e9) / wallNs;
  };
  const inProcess = await rate(misses[0]);
  const one = await rate(misses[1]);
  const second = startAgent();
  // Until the second agent has run a job of its own, a batch would measure one agent.
  let warming = true;
  void second.tookAJob().then(
    () => {
      warming = false;
    },
    () => {},
  );
  while (warming) await http.batch({ ...misses[1], conns: CONNS, ops: CONNS * 2 });
  const two = await rate(misses[1]);
  rows.push(
    executionRow(
      'agent_misses_1',
      `misses/s on 1 agent worker (concurrency ${AGENT_CONCURRENCY}), ${CONNS} connections`,
      '/s',
      'in process',
      inProcess,
      one,
    ),
    executionRow(
      'agent_misses_2',
      `misses/s on 2 agent workers, ${CONNS} connections`,
      '/s',
      '1 agent',
      one,
      two,
    ),
  );

  progress('hits… ');
  const hits = [target(local, 'hit'), target(remote, 'hit')] as const;
  // The entry each server answers from (the agent server's first run is a miss on an agent).
  for (const t of hits) await http.batch({ ...t, expectCache: 'miss', conns: 1, ops: 1 });
  const hitLat: [number[], number[]] = [[], []];
  for (let r = 0; r < Math.ceil((N * 4) / 20); r++) {
    for (const [k, t] of hits.entries()) {
      hitLat[k]!.push(...(await http.batch({ ...t, conns: 1, ops: 20 })).latenciesUs);
    }
  }
  const [hitBase, hitAgent] = hitLat.map((l) => l.map((us) => us / 1000).sort((a, b) => a - b)) as [
    number[],
    number[],
  ];
  rows.push(
    executionRow(
      'agent_hit_p50',
      'the same request cached, on the agent-mode server (no agent involved), p50',
      'ms',
      'in process',
      quantile(hitBase, 0.5),
      quantile(hitAgent, 0.5),
    ),
  );
  progress('done\n');
} catch (err) {
  if (err instanceof BenchInvariantError) console.error(`agent bench: ${err.message}`);
  throw err;
} finally {
  client?.close();
  for (const agent of agents) await agent.stop();
  for (const close of closers.reverse()) await close();
  await postgres.close(prefix);
  await deleteRunKeys(redis);
  redis.disconnect();
}
printExecutionRows(rows);
process.exit(0);
