/**
 * Where the server runs a miss, one function per execution mode (`VIEWER_CACHE_EXECUTION`): in
 * process, on queue workers (and agents taking from the queue), or on agents the server hands
 * jobs to. Each opens what its mode needs on the assembly's release stack and returns the
 * executor the result cache wraps.
 */
import {
  createExecutor,
  createQueueExecutor,
  createQueueJobSource,
  type Executor,
  type Job,
  type JobExecutor,
  type JobRequest,
  migrateQueue,
  type RunOptions,
  SharedJobTokens,
  withResultCache,
} from '../../index.js';
import {
  type AgentDispatch,
  agentExecutor,
  InProcessAgentDispatch,
} from '../agents/agent_dispatch.js';
import { QueueAgentDispatch } from '../agents/queue_agent_dispatch.js';
import { AgentTokens } from '../credentials/agent_tokens.js';
import { type JobTokenGrant, JobTokens } from '../credentials/tokens.js';
import type { ServerConfig } from '../process/config.js';
import { openQueueRedis } from '../process/connections.js';
import type { AssemblyWithStore } from './assembly.js';

/** What the server runs misses on, and what its routes need of the mode. */
export interface Execution {
  readonly executor: Executor;
  /** Verifies a job token (this server's, or, with the queue, any server's). */
  readonly jobTokens: {
    verify(token: string): Promise<Pick<JobTokenGrant, 'workspace' | 'perms'> | null>;
  };
  /** With the queue: the workers heard from recently. */
  readonly liveWorkers?: () => Promise<number>;
  /** With the queue: its jobs by state. */
  readonly queueDepth?: () => Promise<{ waiting: number; active: number; delayed: number }>;
  /** With agents: how jobs reach them and who they are. */
  readonly agents?: {
    readonly dispatch: AgentDispatch;
    readonly tokens: AgentTokens;
    /** Told when a job an agent held ends (its proxied transactions are rolled back). */
    readonly onJobEnded: (listener: (job: Job) => void) => void;
  };
}

/** Opens the execution mode `config.execution` names. */
export function openExecution(
  config: ServerConfig,
  assembly: AssemblyWithStore,
): Promise<Execution> {
  switch (config.execution) {
    case 'in-process':
      return Promise.resolve(inProcessExecution(assembly));
    case 'queue':
      return queueExecution(config, assembly);
    case 'agent':
      return agentExecution(config, assembly);
  }
}

function localExecutor(assembly: AssemblyWithStore, jobTokens: JobTokens | SharedJobTokens) {
  const { apps, datatables, logger } = assembly;
  return createExecutor({ runnables: apps.runnables, datatables, jobTokens, logger });
}

/** Every miss runs here. */
export function inProcessExecution(assembly: AssemblyWithStore): Execution {
  const jobTokens = new JobTokens();
  return {
    executor: localExecutor(assembly, jobTokens),
    jobTokens: { verify: async (token) => jobTokens.verify(token) },
  };
}

/**
 * Misses run on workers (`viewer-cache worker`) and agents taking from the queue; hits are
 * answered here, and job-token children run here (see {@link childrenInProcess}).
 */
export async function queueExecution(
  config: ServerConfig,
  assembly: AssemblyWithStore,
): Promise<Execution> {
  const { pool, secretKey, releases, cacheOptions, logger } = assembly;
  const jobTokens = new JobTokens();
  // The queue's schema is no longer written (records travel sealed, tokens live in Redis); it
  // is still created for servers of the previous version during a rolling upgrade.
  await migrateQueue(pool);
  const queueRedis = openQueueRedis(config, logger);
  releases.push(() => queueRedis.quit());
  // Job tokens are shared (every server accepts a worker's), also those of the children here.
  const shared = new SharedJobTokens({
    redis: queueRedis,
    secretKey,
    prefix: config.queuePrefix,
    logger,
  });
  const local = localExecutor(assembly, shared);
  const queue = createQueueExecutor({
    executor: local,
    redis: queueRedis,
    secretKey,
    wait: config.queueWaitMs,
    prefix: config.queuePrefix,
    logger,
  });
  releases.push(() => queue.close());
  await queue.ready();

  // Agents take from the queue every server enqueues on, beside (or instead of) database
  // workers; a job they run is cached exactly as a database worker caches it.
  const tokens = await startAgentTokens(assembly);
  const source = createQueueJobSource({
    redis: queueRedis,
    secretKey,
    lockDuration: config.agentLockMs,
    prefix: config.queuePrefix,
    logger,
  });
  releases.push(() => source.close());
  await source.ready();
  const dispatch = new QueueAgentDispatch({
    source,
    jobTokens,
    lockMs: config.agentLockMs,
    // Tracked, as a database worker's: the agent's proxied statements are recorded against this
    // very job object (the dispatch hands it out by identity), so the set the run asked is
    // learned and shared, and the server keys on it.
    cacheAround: (agentRunner) => withResultCache(agentRunner, cacheOptions),
  });
  releases.push(async () => dispatch.close());
  return {
    executor: childrenInProcess({ jobs: queue, remote: queue, local }),
    jobTokens: { verify: async (token) => jobTokens.verify(token) ?? (await shared.verify(token)) },
    liveWorkers: () => queue.liveWorkers(),
    queueDepth: () => queue.jobCounts(),
    agents: { dispatch, tokens, onJobEnded: (listener) => jobTokens.onRevoke(listener) },
  };
}

/**
 * A miss is handed to an agent of the group (the same job, viewer recorded here); the local
 * executor still builds jobs and knows the runnables' versions. Job-token children run here.
 */
export async function agentExecution(
  config: ServerConfig,
  assembly: AssemblyWithStore,
): Promise<Execution> {
  const jobTokens = new JobTokens();
  const local = localExecutor(assembly, jobTokens);
  const tokens = await startAgentTokens(assembly);
  const dispatch = new InProcessAgentDispatch(jobTokens, {
    timeoutMs: 60_000,
    startGraceMs: config.agentStartGraceMs,
  });
  assembly.releases.push(async () => dispatch.close());
  const remote = agentExecutor(dispatch, config.agentGroup);
  return {
    executor: childrenInProcess({ jobs: local, remote, local }),
    jobTokens: { verify: async (token) => jobTokens.verify(token) },
    agents: { dispatch, tokens, onJobEnded: (listener) => jobTokens.onRevoke(listener) },
  };
}

async function startAgentTokens(assembly: AssemblyWithStore): Promise<AgentTokens> {
  const tokens = new AgentTokens(assembly.pool, { logger: assembly.logger });
  await tokens.start();
  assembly.releases.push(async () => tokens.stop());
  return tokens;
}

/**
 * With jobs on workers (queue or agents): what the server's result cache runs a miss on. A job
 * started with a job token — a runnable's child run over HTTP, `POST /api/w/:ws/jobs/run_child`
 * — runs here, in process (`local`); every other miss goes to the workers (`remote`: the queue,
 * or the agents). Jobs are built by `jobs` (the queue executor records each job's origin kind).
 *
 * Why: the parent holds its worker (or agent) slot while it waits for the child. Handed to the
 * workers, the child waits for a slot too, and once every slot is held by a parent (one worker
 * of concurrency 1 and one parent are enough) nothing ever runs it: the parent's request failed
 * at the wait (60 s, E_QUEUE_TIMEOUT or E_EXECUTOR_TIMEOUT) and held its slot until then.
 *
 * Nothing about the viewer changes: the child's viewer is its parent's, which the server read
 * from the shared job token (Redis) when it built the job, and its key is the same wherever
 * it runs (a hit is still answered before anything runs).
 */
export function childrenInProcess(parts: {
  jobs: Executor;
  remote: JobExecutor;
  local: JobExecutor;
}): Executor {
  const { jobs, remote, local } = parts;
  const children = new WeakSet<Job>();
  return {
    runnable: (path) => jobs.runnable(path),
    createJob(request: JobRequest): Job {
      const job = jobs.createJob(request);
      if (request.origin.kind === 'job-token') children.add(job);
      return job;
    },
    run(job: Job, options?: RunOptions) {
      return children.has(job) ? local.run(job, options) : remote.run(job, options);
    },
  };
}
