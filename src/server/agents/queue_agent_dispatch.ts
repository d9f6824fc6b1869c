import {
  ExecutorFailedError,
  type HeldQueueJob,
  type Job,
  type JobExecutor,
  type JobResult,
  type QueueJobSource,
  QueueWorkerLostError,
  queueFailureCode,
} from '../../index.js';
import type { AgentIdentity } from '../credentials/agent_tokens.js';
import type { JobTokens } from '../credentials/tokens.js';
import { type AgentDispatch, agentResult } from './agent_dispatch.js';
import { AgentPresence } from './agent_presence.js';
import { type AgentOutcome, failureOf, type TakenJob } from './agent_protocol.js';
import { startTakeSpan } from './agent_tracing.js';

interface Holding {
  readonly agent: AgentIdentity;
  readonly job: Job;
  readonly held: HeldQueueJob;
  readonly resolve: (value: unknown) => void;
  readonly reject: (err: Error) => void;
  silence: NodeJS.Timeout | undefined;
}

export interface QueueAgentDispatchOptions {
  /** Where jobs come from: the queue every server enqueues on (createQueueJobSource). */
  readonly source: QueueJobSource;
  /**
   * Wraps the hand-off to an agent in the result cache a queue worker uses (same store, the
   * tracked fingerprint, same seal): the entry is looked up, fingerprint-checked and written
   * sealed under the same key as by a database worker. Tracking sees the agent's statements
   * because its proxied requests resolve to the very job object handed to the cache.
   */
  readonly cacheAround: (agents: JobExecutor) => JobExecutor;
  /** Tokens of the jobs this server's agents hold (their query-proxy requests carry them). */
  readonly jobTokens: JobTokens;
  /** An agent silent (no beat, no finish) this long loses its job: the lock then lapses. */
  readonly lockMs: number;
}

/**
 * {@link AgentDispatch} for a server in queue mode: an agent's take is served from the BullMQ
 * queue (any server's misses), so one queue feeds database workers and agents alike, across
 * servers. The job is verified and claimed as a database worker does (`claimQueuedJob`), run
 * through the same result cache with the agent as its executor, and ended with the same sealed
 * answer or bare code. The lock is renewed on each of the agent's beats; an agent that goes
 * silent loses the job here (its token dies) and the lock lapses: the job returns to the queue
 * once, from the same record (same viewer), or fails E_QUEUE_WORKER_LOST.
 */
export class QueueAgentDispatch implements AgentDispatch {
  readonly presence = new AgentPresence();
  /** Aborted when the server stops: every take waiting on the queue answers at once. */
  readonly #ending = new AbortController();
  readonly #source: QueueJobSource;
  readonly #cached: JobExecutor;
  readonly #jobTokens: JobTokens;
  readonly #lockMs: number;
  readonly #holding = new Map<string, Holding>();
  /** The agent a job is being handed to (set while the cache decides, read by the hand-off). */
  readonly #handing = new Map<string, (job: Job) => Promise<unknown>>();

  constructor(options: QueueAgentDispatchOptions) {
    this.#source = options.source;
    this.#jobTokens = options.jobTokens;
    this.#lockMs = options.lockMs;
    const handOff: JobExecutor = {
      run: async (job: Job): Promise<JobResult> => {
        const hand = this.#handing.get(job.id);
        if (hand === undefined) throw new ExecutorFailedError('no agent to hand the job to');
        return agentResult(job, await hand(job));
      },
    };
    this.#cached = options.cacheAround(handOff);
  }

  run(): Promise<unknown> {
    // In queue mode a server's misses go through the queue executor, never through here.
    return Promise.reject(new ExecutorFailedError('jobs reach agents through the queue'));
  }

  async take(agent: AgentIdentity, waitMs: number, hangUp: AbortSignal): Promise<TakenJob | null> {
    const until = Date.now() + waitMs;
    const signal = AbortSignal.any([hangUp, this.#ending.signal]);
    const closeTake = this.presence.taking(agent);
    try {
      do {
        if (signal.aborted) return null;
        // The agent's own workspace's and group's queue: it never meets another's job.
        const held = await this.#source.next(
          agent.workspace,
          Math.max(0, until - Date.now()),
          signal,
          agent.group,
        );
        if (held === null) return null;
        const taken = await this.#hand(held, agent, signal);
        if (taken !== null) return taken;
      } while (!signal.aborted && Date.now() < until);
      return null;
    } finally {
      closeTake();
    }
  }

  endTakes(): void {
    this.#ending.abort();
  }

  beat(agent: AgentIdentity, jobId: string): boolean {
    this.presence.seen(agent);
    const holding = this.#holding.get(jobId);
    if (holding === undefined || holding.agent.id !== agent.id) return false;
    this.#listen(holding);
    void holding.held.extend().then((kept) => {
      if (!kept) this.#lose(holding);
    });
    return true;
  }

  async finish(agent: AgentIdentity, jobId: string, outcome: AgentOutcome): Promise<boolean> {
    this.presence.seen(agent);
    const holding = this.#holding.get(jobId);
    if (holding === undefined || holding.agent.id !== agent.id) return false;
    if (holding.job.workspace !== agent.workspace) return false;
    this.#drop(holding);
    // The lock may have lapsed, and the job gone to another taker, before this holding's
    // silence bound fired: that bound starts at the hand-off, a moment after the take set the
    // lock, and a timer fires late on a busy process. The answer is the run's only while the
    // lock is still this server's; renewed here, it stays so until the job ends just after.
    if (!(await holding.held.extend())) {
      holding.reject(new QueueWorkerLostError());
      return false;
    }
    if (outcome.ok) holding.resolve(outcome.value);
    else holding.reject(failureOf(outcome.code, outcome.message, outcome.sqlstate));
    return true;
  }

  jobOfToken(agent: AgentIdentity, token: string): Job | null {
    const job = this.#jobTokens.jobOfToken(token);
    if (job === null) return null;
    const holding = this.#holding.get(job.id);
    if (holding === undefined || holding.agent.id !== agent.id || holding.job !== job) return null;
    return job.workspace === agent.workspace ? job : null;
  }

  close(): void {
    this.endTakes();
    // Not failed: the lock lapses and the job runs again once, on another server's agent or a
    // worker (the waiting server may be another one, still up).
    for (const holding of [...this.#holding.values()]) this.#lose(holding);
  }

  /**
   * Runs `held` through the cache with `agent` as its executor: resolves with the job as the
   * agent takes it, or null when the cache answered without it (an entry another worker wrote
   * meanwhile) or the agent hung up first. The job ends in the queue when the cache settles.
   */
  #hand(held: HeldQueueJob, agent: AgentIdentity, signal: AbortSignal): Promise<TakenJob | null> {
    const { job } = held;
    return new Promise((resolve) => {
      let lost = false;
      this.#handing.set(job.id, (handed) => {
        this.#handing.delete(job.id);
        if (signal.aborted) {
          // The agent hung up before it got the job: hand it back to the queue (lock lapses).
          lost = true;
          resolve(null);
          return Promise.reject(new QueueWorkerLostError());
        }
        return new Promise((done, fail) => {
          const holding: Holding = {
            agent,
            job: handed,
            held,
            resolve: done,
            reject: (err) => {
              if (err instanceof QueueWorkerLostError) lost = true;
              fail(err);
            },
            silence: undefined,
          };
          this.#holding.set(handed.id, holding);
          this.presence.holds(agent, 1);
          this.#listen(holding);
          // Called by the cache's run of the job: its context is the run's, the take a child.
          const traceparent = startTakeSpan().taken();
          resolve({
            job: handed,
            jobToken: this.#jobTokens.issue(handed),
            beatMs: Math.max(250, Math.floor(this.#lockMs / 3)),
            ...(traceparent === null ? {} : { traceparent }),
          });
        });
      });
      this.#cached
        .run(job)
        .then(
          (result) => held.complete(result.json()),
          (err: unknown) => (lost ? undefined : held.fail(queueFailureCode(err))),
        )
        .catch(() => {})
        .finally(() => {
          this.#handing.delete(job.id);
          resolve(null);
        });
    });
  }

  /** (Re)arms the silence bound of a holding. */
  #listen(holding: Holding): void {
    clearTimeout(holding.silence);
    holding.silence = setTimeout(() => this.#lose(holding), this.#lockMs);
    holding.silence.unref();
  }

  /** The agent went silent or the lock was lost: the job is no longer its to finish. */
  #lose(holding: Holding): void {
    if (this.#holding.get(holding.job.id) !== holding) return;
    this.#drop(holding);
    holding.reject(new QueueWorkerLostError());
  }

  #drop(holding: Holding): void {
    clearTimeout(holding.silence);
    if (this.#holding.get(holding.job.id) === holding) {
      this.#holding.delete(holding.job.id);
      this.presence.holds(holding.agent, -1);
      this.#jobTokens.revoke(holding.job);
    }
  }
}
