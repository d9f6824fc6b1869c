import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { AgentProcess } from './agent_process.js';
import { freePort } from './free_port.js';
import { createTestDatabase, type TestDatabase } from './pg.js';
import { QUERY_OVERLAP } from './query_overlap.js';
import {
  type CliResult,
  clearRedisPrefix,
  httpRequest,
  type RequestOptions,
  runCli,
  ServerProcess,
  serverEnv,
} from './server_process.js';

export interface E2eOptions {
  /** Role and database prefix of this file (roles are cluster-wide). */
  readonly prefix: string;
  readonly secretKey: string;
  readonly redisUrl: string;
  /** This server's keys in the shared Redis. */
  readonly redisPrefix: string;
  /**
   * Where misses run: `queue` starts the server with VIEWER_CACHE_EXECUTION=queue and `workers`
   * `viewer-cache worker` processes beside it. @default $VC_TEST_EXECUTION, else in process
   */
  readonly execution?: 'in-process' | 'queue' | 'agent';
  /** Worker processes with the queue. @default 1 */
  readonly workers?: number;
  /** More environment for the server and its workers. */
  readonly env?: Record<string, string>;
  /** More variables for the agent worker process (with execution 'agent'). */
  readonly agentEnv?: Record<string, string>;
  /** More arguments of the agent worker (`worker --agent --demo …`). */
  readonly agentArgs?: string[];
}

/**
 * The end-to-end server of `server_e2e.test.ts`: `viewer-cache --json serve` on its own database
 * (demo seeded, role names prefixed) and the suite's Redis, and the CLI with the same
 * environment. Every CLI output is kept, for the test that checks nothing secret was printed.
 */
export class E2eServer {
  readonly cliOutputs: string[] = [];
  /**
   * VC_TEST_EXECUTION=agent: the server hands every miss to an agent worker process
   * (`worker --agent --demo`, no database credential), started once the server is ready.
   */
  get execution(): 'in-process' | 'queue' | 'agent' {
    const asked = this.options.execution ?? process.env['VC_TEST_EXECUTION'];
    return asked === 'agent' || asked === 'queue' ? asked : 'in-process';
  }
  agent: AgentProcess | undefined;
  env: NodeJS.ProcessEnv = {};
  server!: ServerProcess;
  /** The worker processes, with the queue (started once the server is ready). */
  readonly workers: ServerProcess[] = [];
  /** The server's URL, once it is ready. */
  url = '';
  port = 0;
  /** A client of the shared Redis, for looking at this server's entries. */
  redis!: Redis;
  #db: TestDatabase | undefined;
  #dataDir: string | undefined;

  constructor(readonly options: E2eOptions) {}

  /** Creates the database and starts the server (without waiting for it: see `ready`). */
  async start(): Promise<void> {
    const { prefix, secretKey, redisUrl, redisPrefix } = this.options;
    this.#db = await createTestDatabase(prefix);
    this.#dataDir = await mkdtemp(join(tmpdir(), 'viewer-cache-e2e-'));
    this.port = await freePort();
    this.env = serverEnv({
      DATABASE_URL: this.#db.url,
      REDIS_URL: redisUrl,
      VIEWER_CACHE_REDIS_PREFIX: redisPrefix,
      // The 200 ms default degrades runs to uncached when a loaded machine stalls: hits must be hits.
      VIEWER_CACHE_REDIS_TIMEOUT_MS: '5000',
      VIEWER_CACHE_SECRET_KEY: secretKey,
      // DATABASE_URL is set, so the demo is seeded only when asked.
      VIEWER_CACHE_DEMO: 'true',
      VIEWER_CACHE_DEMO_ROLE_PREFIX: prefix,
      VIEWER_CACHE_DATA_DIR: this.#dataDir,
      // Only the first scheduled run (before the ready line): later ones would move the counters.
      VIEWER_CACHE_SCHEDULE_MS: '86400000',
      HOST: '127.0.0.1',
      PORT: String(this.port),
      LOG_LEVEL: 'debug',
      ...(this.execution === 'agent' ? { VIEWER_CACHE_EXECUTION: 'agent' } : {}),
      ...(this.queued
        ? {
            VIEWER_CACHE_EXECUTION: 'queue',
            VIEWER_CACHE_QUEUE_PREFIX: `{${prefix}q}`,
            VIEWER_CACHE_SERVER_URL: `http://127.0.0.1:${this.port}`,
          }
        : {}),
      ...this.options.env,
    });
    this.redis = new Redis(redisUrl, { lazyConnect: true, maxRetriesPerRequest: 1 });
    this.redis.on('error', () => {});
    this.server = new ServerProcess(this.env);
    // Workers start beside the server, as an operator would start them (they wait for Redis
    // and migrate what they need): the server's first scheduled run waits for one.
    if (this.queued) {
      for (let i = 0; i < (this.options.workers ?? 1); i++) {
        this.workers.push(new ServerProcess(this.env, ['--port', '0'], 'worker'));
      }
    }
  }

  /** Waits for the ready line; resolves to what it said. */
  async ready(): Promise<{ url: string; tokens?: Record<string, string> }> {
    const ready = await this.server.ready;
    this.url = ready.url;
    if (this.execution === 'agent' && this.agent === undefined) {
      const { token } = await this.cliJson<{ token: string }>([
        'agent-token',
        'create',
        '--group',
        'default',
      ]);
      this.agent = new AgentProcess(
        {
          VIEWER_CACHE_SERVER_URL: this.url,
          VIEWER_CACHE_AGENT_TOKEN: token,
          ...this.options.agentEnv,
        },
        this.options.prefix,
        this.options.agentArgs,
      );
    }
    await Promise.all(this.workers.map((worker) => worker.ready));
    return ready;
  }

  get queued(): boolean {
    return this.execution === 'queue';
  }

  /** One more `viewer-cache worker` process with the server's environment; resolves when ready. */
  async startWorker(args: string[] = [], env: Record<string, string> = {}): Promise<ServerProcess> {
    const worker = new ServerProcess({ ...this.env, ...env }, ['--port', '0', ...args], 'worker');
    this.workers.push(worker);
    await worker.ready;
    return worker;
  }

  readonly request = (method: 'GET' | 'POST', path: string, options?: RequestOptions) =>
    httpRequest(this.url, method, path, options);

  /** The CLI with the server's environment. */
  readonly cli = async (args: string[]): Promise<CliResult> => {
    const result = await runCli(this.env, args);
    this.cliOutputs.push(result.stdout, result.stderr);
    return result;
  };

  /** The CLI with `--json`, expected to succeed; its stdout parsed. */
  readonly cliJson = async <T>(args: string[]): Promise<T> => {
    const result = await this.cli(['--json', ...args]);
    if (result.code !== 0) {
      throw new Error(`viewer-cache ${args.join(' ')} exited ${result.code}: ${result.stderr}`);
    }
    return JSON.parse(result.stdout) as T;
  };

  /**
   * Kills the server if it still runs, and removes its keys, database and folder. Fails when
   * the server warned of an overlapping pg query (see query_overlap.ts).
   */
  async stop(): Promise<void> {
    if (this.agent !== undefined) {
      this.agent.signal('SIGKILL');
      await this.agent.closed;
    }
    if (this.server?.running) await this.server.kill();
    for (const worker of this.workers) if (worker.running) await worker.kill();
    const overlap = this.server !== undefined && QUERY_OVERLAP.test(this.server.stderr);
    if (this.redis !== undefined) {
      await clearRedisPrefix(this.redis, this.options.redisPrefix);
      if (this.queued) await clearRedisPrefix(this.redis, `{${this.options.prefix}q}`);
      this.redis.disconnect();
    }
    await this.#db?.drop();
    if (this.#dataDir !== undefined) await rm(this.#dataDir, { recursive: true, force: true });
    if (overlap) throw new Error(`the server sent overlapping pg queries:\n${this.server.stderr}`);
  }
}
