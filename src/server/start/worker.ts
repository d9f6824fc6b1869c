import { createServer, type Server } from 'node:http';
import { Counter, Histogram } from 'prom-client';
import {
  createExecutor,
  createQueueWorker,
  InvalidJobError,
  type Logger,
  type QueueWorker,
  SharedJobTokens,
  WORKSPACE_RE,
  WorkerMisconfiguredError,
  withResultCache,
} from '../../index.js';
import { boundedCheck, READY_CHECK_MS } from '../http/readiness.js';
import type { ServerConfig } from '../process/config.js';
import { openQueueRedis } from '../process/connections.js';
import { createMetrics } from '../process/metrics.js';
import { redisReadiness } from '../process/store_readiness.js';
import { openAssembly } from './assembly.js';

export interface WorkerCommandOptions {
  /** Jobs run at once. @default 1 */
  concurrency: number;
  /** A port serving `/healthz` and `/metrics` (0: an ephemeral one; absent: none). */
  port?: number;
  /** How long a job's lock lives: a dead worker's job returns to the queue after about this. */
  lockMs?: number;
}

export interface RunningWorker {
  readonly worker: QueueWorker;
  /** The liveness and metrics URL, when a port was asked for. */
  readonly url: string | null;
  /** Stops taking jobs, lets the running ones finish, then closes everything. */
  close(): Promise<void>;
}

/**
 * A queue worker process (`viewer-cache worker`): the same configuration as `serve` — its
 * database, Redis and secret key, the same apps — and no HTTP API. It runs each job with the
 * viewer its record names, through a result cache identical to the server's, so the entry it
 * writes is the one the server (and every other worker) looks up.
 */
export async function startWorker(
  config: ServerConfig,
  logger: Logger,
  options: WorkerCommandOptions,
): Promise<RunningWorker> {
  if (config.databaseUrl === null) {
    throw new TypeError('a worker needs DATABASE_URL: the database the servers use');
  }
  if (config.secretKey === null) {
    throw new TypeError(
      'a worker needs VIEWER_CACHE_SECRET_KEY: the servers’ secret (queue messages and entries are sealed under it)',
    );
  }
  // A runnable's job-token child run goes to the server (VIEWER_CACHE_SERVER_URL), from
  // parts validated here, as on the server.
  const childRunUrl = (workspace: string) => {
    if (!WORKSPACE_RE.test(workspace)) throw new InvalidJobError('invalid workspace');
    if (config.serverUrl === null) {
      // The operator's missing setting, not the caller's bad request: coded, and in this log.
      const err = new WorkerMisconfiguredError();
      logger.error({ code: err.code }, err.message);
      throw err;
    }
    return new URL(`/api/w/${encodeURIComponent(workspace)}/jobs/run_child`, config.serverUrl);
  };
  // The same apps as the servers (your module, or the demo's) and the same cache: same store,
  // fingerprint and seal, so the same keys.
  const assembly = await openAssembly(config, logger, {
    role: 'worker',
    apps: {
      childRunUrl,
      whenNone: 'refuse',
      refusal: 'a worker runs the servers’ apps: give --apps PATH (VIEWER_CACHE_APPS) or --demo',
    },
    store: true,
  });
  const { apps: world, secretKey, datatables, releases } = assembly;
  if (config.serverUrl === null) {
    logger.warn(
      { code: WorkerMisconfiguredError.code },
      'VIEWER_CACHE_SERVER_URL is not set: a runnable that starts a child run over HTTP with its job token will fail E_WORKER_MISCONFIGURED',
    );
  }
  const close = () => assembly.release();
  try {
    const queueRedis = openQueueRedis(config, logger);
    releases.push(() => queueRedis.quit());
    const jobTokens = new SharedJobTokens({
      redis: queueRedis,
      secretKey,
      prefix: config.queuePrefix,
      logger,
    });
    const executor = createExecutor({ runnables: world.runnables, datatables, jobTokens, logger });
    // Tracked: the worker runs the job, so it is the one that learns what a runnable version
    // depends on (SPEC invariant 17). The grown set is written to the shared learned sets
    // (Postgres, announced on viewer_cache_learned) before the result is stored under it, and
    // the servers read that set before keying, exactly as two in-process servers share them: a
    // server keys a run on the fingerprint over the stored set, the one the entry is under.
    const cache = withResultCache(executor, assembly.cacheOptions);
    const metrics = createMetrics(cache, datatables);
    const jobs = new Counter({
      name: 'viewer_cache_worker_jobs_total',
      help: 'Jobs this worker finished, by outcome code',
      labelNames: ['code'],
      registers: [metrics.registry],
    });
    const seconds = new Histogram({
      name: 'viewer_cache_worker_job_seconds',
      help: 'Time from taking a job to answering it',
      labelNames: ['code'],
      buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers: [metrics.registry],
    });
    const waited = new Histogram({
      name: 'viewer_cache_queue_wait_seconds',
      help: 'Time a job waited in the queue before a worker took it',
      buckets: [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60],
      registers: [metrics.registry],
    });
    const retries = new Counter({
      name: 'viewer_cache_worker_retries_total',
      help: 'Jobs this worker ran a second time (their first worker was lost)',
      registers: [metrics.registry],
    });
    const stalls = new Counter({
      name: 'viewer_cache_worker_stalls_total',
      help: 'Jobs this worker found stalled (their worker lost) and handed back',
      registers: [metrics.registry],
    });
    const worker = createQueueWorker({
      executor: cache,
      redis: queueRedis,
      secretKey,
      prefix: config.queuePrefix,
      concurrency: options.concurrency,
      ...(options.lockMs === undefined ? {} : { lockDuration: options.lockMs }),
      logger,
      onFinished: ({ code, ms, waitedMs, retried }) => {
        jobs.inc({ code });
        seconds.observe({ code }, ms / 1000);
        waited.observe(waitedMs / 1000);
        if (retried) retries.inc();
      },
      onStalled: () => stalls.inc(),
    });
    // First out on close: stop taking jobs and finish the running ones before the rest goes.
    releases.push(() => worker.close());
    await worker.ready();

    let url: string | null = null;
    if (options.port !== undefined) {
      const queueState = boundedCheck(redisReadiness(queueRedis, READY_CHECK_MS));
      const http: Server = createServer((request, response) => {
        if (request.url === '/healthz') {
          // Alive means able to take jobs: its queue answers (within a bound, one question at
          // a time however often it is probed).
          void queueState().then((queue) => {
            const ok = queue === 'ok';
            response.writeHead(ok ? 200 : 503, { 'content-type': 'application/json' });
            response.end(JSON.stringify({ ok, running: worker.running, queue }));
          });
        } else if (request.url === '/metrics') {
          metrics.registry.metrics().then(
            (text) => {
              response.writeHead(200, { 'content-type': metrics.registry.contentType });
              response.end(text);
            },
            () => {
              response.writeHead(500);
              response.end();
            },
          );
        } else {
          response.writeHead(404);
          response.end();
        }
      });
      http.on('error', (err) => logger.warn({ err: err.message }, 'worker http error'));
      await new Promise<void>((resolve) => http.listen(options.port, config.host, resolve));
      const address = http.address();
      url =
        typeof address === 'object' && address !== null
          ? `http://${config.host}:${address.port}`
          : null;
      releases.push(() => new Promise((resolve) => http.close(resolve)));
    }
    logger.info({ id: worker.id, concurrency: options.concurrency }, 'worker started');
    return { worker, url, close };
  } catch (err) {
    await close();
    throw err;
  }
}
