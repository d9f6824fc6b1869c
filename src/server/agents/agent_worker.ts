import {
  AGENT_PROTOCOL_VERSION,
  clientTraced,
  createExecutor,
  type Job,
  type JobExecutor,
  type Logger,
  type RawDuckdbOptions,
  type RawPythonOptions,
  ResultTooLargeError,
  type RunnableDefinition,
  runTraced,
  ViewerCacheError,
} from '../../index.js';
import { PollBackoff } from '../process/poll_backoff.js';
import { AGENT_PROTOCOL_HEADER, JOB_TOKEN_HEADER, type TakenJob } from './agent_protocol.js';
import { createProxyConnector } from './proxy_client.js';

/** What an agent worker needs, and nothing else: no database, no Redis, no secret key. */
export interface AgentWorkerOptions {
  readonly serverUrl: URL;
  readonly agentToken: string;
  readonly runnables: Readonly<Record<string, RunnableDefinition>>;
  /** Jobs run at once. @default 1 */
  readonly concurrency?: number;
  /** How long one take waits for a job (ms). @default 20000 */
  readonly waitMs?: number;
  /**
   * The first pause before taking again after the server did not answer (ms); doubled per
   * failure in a row up to `reconnectMaxMs`. @default 500
   */
  readonly reconnectMs?: number;
  /** The longest pause between two tries to reach the server (ms). @default 5000 */
  readonly reconnectMaxMs?: number;
  readonly logger: Logger;
  /**
   * How Python runnables start here (`python3` on PATH by default). Their statements go to
   * this agent's per-job socket and on, with the server's job token, to the query proxy.
   */
  readonly python?: RawPythonOptions;
  /** Bounds of DuckDB runnables here; their copies are read through the query proxy. */
  readonly duckdb?: RawDuckdbOptions;
}

export interface RunningAgent {
  /** Stops taking jobs, lets the ones held finish and report, then resolves. */
  stop(): Promise<void>;
  /** Settles when the worker stopped: rejects when the server refused it (revoked, old). */
  readonly done: Promise<void>;
}

/** Variables an agent refuses to start with: it must never hold a database credential. */
export const AGENT_FORBIDDEN_ENV = [
  'DATABASE_URL',
  'VIEWER_CACHE_LISTEN_URL',
  'REDIS_URL',
  'VIEWER_CACHE_SECRET_KEY',
] as const;

/** Refuses (coded) an environment that hands the agent credentials it must not have. */
export function checkAgentEnvironment(env: NodeJS.ProcessEnv): void {
  const set = AGENT_FORBIDDEN_ENV.filter((name) => (env[name] ?? '') !== '');
  if (set.length > 0) {
    throw new ViewerCacheError(
      `an agent worker holds no database or Redis credentials and no secret key: unset ${set.join(', ')}`,
      { code: 'E_AGENT_CREDENTIALS', status: 400 },
    );
  }
}

/**
 * An agent worker: takes jobs of its group from the server (long-poll), runs them with the same
 * executor as in process — `ctx.datatable(…)` and SQL runnables get a client backed by the
 * server's query proxy — and reports each value or failure code. One log line per finished job:
 * path, outcome code, duration; never the viewer, args or rows.
 */
export function startAgentWorker(options: AgentWorkerOptions): RunningAgent {
  const { serverUrl, agentToken, logger } = options;
  const waitMs = options.waitMs ?? 20_000;
  const concurrency = options.concurrency ?? 1;
  const tokens = new Map<string, string>();
  const executor = createExecutor({
    runnables: options.runnables,
    datatables: createProxyConnector({
      serverUrl,
      agentToken,
      jobTokenOf: (job) => tokens.get(job.id),
    }),
    // The token is the server's, issued when this agent took the job: ctx.jobToken shows it.
    jobTokens: { issue: (job) => tokens.get(job.id) ?? '', revoke: () => {} },
    logger,
    ...(options.python === undefined ? {} : { python: options.python }),
    ...(options.duckdb === undefined ? {} : { duckdb: options.duckdb }),
  });
  const headers = {
    authorization: `Bearer ${agentToken}`,
    [AGENT_PROTOCOL_HEADER]: String(AGENT_PROTOCOL_VERSION),
    'content-type': 'application/json',
  };
  const stopping = new AbortController();
  let fatal: Error | null = null;
  // The server is gone (restarting, deployed, cut off): every slot waits on one shared pause,
  // so an outage logs one warning per back-off step whatever the concurrency, and the agent
  // tries again for ever. The pause's timer is not unref'd: it is what keeps the process alive
  // while nothing else is (an unref'd one let the event loop empty and the agent exit).
  const backoff = new PollBackoff(options.reconnectMs ?? 500, options.reconnectMaxMs ?? 5000);
  let pause: Promise<void> | null = null;
  const waitToRetry = (err: unknown): Promise<void> => {
    if (pause !== null) return pause;
    backoff.failed();
    const delayMs = backoff.delayMs;
    logger.warn(
      {
        code:
          (err as { code?: unknown }).code ?? (err as { cause?: { code?: unknown } }).cause?.code,
        failures: backoff.failures,
        retryInMs: delayMs,
      },
      'agent could not reach the server: retrying',
    );
    pause = new Promise<void>((resolve) => {
      const timer = setTimeout(done, delayMs);
      function done() {
        clearTimeout(timer);
        stopping.signal.removeEventListener('abort', done);
        pause = null;
        resolve();
      }
      stopping.signal.addEventListener('abort', done, { once: true });
    });
    return pause;
  };
  const reached = () => {
    const failures = backoff.answered();
    if (failures > 0) logger.info({ failures }, 'agent reached the server again');
  };

  const take = async (): Promise<TakenJob | null> => {
    const response = await fetch(new URL('/api/agent/jobs/take', serverUrl), {
      method: 'POST',
      headers,
      body: JSON.stringify({ waitMs }),
      signal: stopping.signal,
    });
    if (response.status === 204) {
      reached();
      return null;
    }
    // A server starting or stopping (a proxy in front answering 502/503): not an answer yet.
    if (response.status >= 500) {
      await response.body?.cancel();
      throw new ViewerCacheError(`take answered ${response.status}`, {
        code: 'E_AGENT_UNREACHABLE',
        status: response.status,
      });
    }
    const body = (await response.json()) as {
      job?: Job;
      jobToken?: string;
      beatMs?: number;
      traceparent?: unknown;
      error?: { code?: string; message?: string };
    };
    if (!response.ok || body.job === undefined || body.jobToken === undefined) {
      const err = new ViewerCacheError(body.error?.message ?? `take answered ${response.status}`, {
        code: body.error?.code ?? 'E_AGENT_REFUSED',
        status: response.status,
      });
      // Refused by the server (revoked token, old protocol): retrying will not help.
      if (response.status === 401 || response.status === 403 || response.status === 426) {
        fatal = err;
        stopping.abort();
      }
      throw err;
    }
    reached();
    const { beatMs, traceparent } = body;
    return {
      job: body.job,
      jobToken: body.jobToken,
      ...(typeof beatMs === 'number' && beatMs >= 100 ? { beatMs } : {}),
      ...(typeof traceparent === 'string' ? { traceparent } : {}),
    };
  };

  // While a job runs, a beat when the server asks for them (a job it took from the queue: the
  // beat renews its lock). A lost beat is not fatal: the job's outcome is reported anyway.
  const beat = (jobId: string) =>
    fetch(new URL(`/api/agent/jobs/${encodeURIComponent(jobId)}/beat`, serverUrl), {
      method: 'POST',
      headers,
      body: '{}',
    }).then(
      (response) => response.body?.cancel(),
      () => {},
    );

  const finish = async (jobId: string, jobToken: string, outcome: Record<string, unknown>) => {
    // With the job's token, so that the server honours the trace context beside it.
    const response = await clientTraced('viewer_cache.agent.finish', (traceparent) =>
      fetch(new URL(`/api/agent/jobs/${encodeURIComponent(jobId)}/finish`, serverUrl), {
        method: 'POST',
        headers: {
          ...headers,
          [JOB_TOKEN_HEADER]: jobToken,
          ...(traceparent === null ? {} : { traceparent }),
        },
        body: JSON.stringify(outcome),
      }),
    );
    // Larger than the server takes from agents: the run fails with that code, not a bare one.
    if (response.status === 413) {
      throw new ResultTooLargeError(
        "the job's result is larger than the server takes from agents (VIEWER_CACHE_AGENT_RESULT_LIMIT_BYTES)",
      );
    }
    if (!response.ok && response.status !== 404) {
      throw new Error(`finish answered ${response.status}`);
    }
  };

  // The run joins the server's trace when it handed one: the agent's spans are its children.
  const runOne = ({ job, jobToken, beatMs, traceparent }: TakenJob) =>
    runTraced(traceparent ?? null, 'viewer_cache.agent.run', () => runJob(job, jobToken, beatMs), {
      'viewer_cache.runnable.path': job.runnable.path,
    });

  const runJob = async (job: Job, jobToken: string, beatMs: number | undefined) => {
    const started = performance.now();
    const beating = beatMs === undefined ? undefined : setInterval(() => void beat(job.id), beatMs);
    tokens.set(job.id, jobToken);
    // Children run here, under the parent's token: the server resolves it to the parent, whose
    // viewer and scope a child inherits anyway (a job-token origin).
    const dispatcher: JobExecutor = {
      run: (child) => {
        tokens.set(child.id, jobToken);
        return executor.run(child, { dispatcher }).finally(() => tokens.delete(child.id));
      },
    };
    let code = 'ok';
    try {
      const result = await executor.run(job, { dispatcher });
      await finish(job.id, jobToken, { ok: true, value: result.value ?? null });
    } catch (thrown) {
      const err = thrown as { code?: unknown; message?: unknown; sqlstate?: unknown };
      code = typeof err.code === 'string' ? err.code : 'E_EXECUTOR_FAILED';
      await finish(job.id, jobToken, {
        ok: false,
        code,
        message: typeof err.message === 'string' ? err.message : '',
        ...(typeof err.sqlstate === 'string' ? { sqlstate: err.sqlstate } : {}),
      }).catch(() => {});
    } finally {
      clearInterval(beating);
      tokens.delete(job.id);
      logger.info(
        { path: job.runnable.path, code, ms: Math.round(performance.now() - started) },
        'job finished',
      );
    }
  };

  const slot = async () => {
    while (!stopping.signal.aborted) {
      let taken: TakenJob | null;
      try {
        taken = await take();
      } catch (err) {
        if (stopping.signal.aborted) break;
        await waitToRetry(err);
        continue;
      }
      if (taken !== null) await runOne(taken);
    }
  };

  const done = Promise.all(Array.from({ length: concurrency }, slot)).then(() => {
    if (fatal !== null) throw fatal;
  });
  done.catch(() => {});
  return {
    done,
    async stop() {
      stopping.abort();
      await done.catch(() => {});
    },
  };
}
