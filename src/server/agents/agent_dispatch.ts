import {
  ExecutorFailedError,
  ExecutorTimeoutError,
  type Job,
  type JobExecutor,
  type JobResult,
  NoWorkersError,
} from '../../index.js';
import type { AgentIdentity } from '../credentials/agent_tokens.js';
import type { JobTokens } from '../credentials/tokens.js';
import { AgentPresence } from './agent_presence.js';
import { type AgentOutcome, failureOf, type TakenJob } from './agent_protocol.js';
import { startTakeSpan, type TakeSpan } from './agent_tracing.js';

/**
 * The agent dispatch port: where the server hands jobs to agent workers and hears back. The
 * server side is {@link AgentDispatch.run}; the agents' HTTP routes call `take`, `finish` and
 * `jobOfToken`. One implementation here (in process: the server that records a job is the one
 * an agent takes it from); a queue-backed one replaces it without changing the routes.
 */
export interface AgentDispatch {
  /** Runs `job` on an agent of `group` of its workspace; settles with the agent's outcome. */
  run(job: Job, group: string): Promise<unknown>;
  /**
   * The next job for `agent` (its workspace and group only), waiting up to `waitMs` for one;
   * null when none came or `signal` aborted (the agent hung up). Taking a job issues its token.
   */
  take(agent: AgentIdentity, waitMs: number, signal: AbortSignal): Promise<TakenJob | null>;
  /**
   * Ends a job `agent` holds; false when it holds no such job (ended, another's, or, from the
   * queue, one whose lock it no longer holds).
   */
  finish(agent: AgentIdentity, jobId: string, outcome: AgentOutcome): boolean | Promise<boolean>;
  /** The agent still works on a job it holds (renews a queue lock); false when it holds none. */
  beat(agent: AgentIdentity, jobId: string): boolean;
  /** The job `token` stands for, if it is running and `agent` holds it; else null. */
  jobOfToken(agent: AgentIdentity, token: string): Job | null;
  /** Which agents are connected, per workspace and group (`/readyz`). */
  readonly presence: AgentPresence;
  /**
   * The server is stopping: every open take answers "no job" now and later ones at once, so
   * closing the HTTP server does not wait out agents' long-polls.
   */
  endTakes(): void;
  /** Fails every job waiting or held (the server is stopping). */
  close(): void;
}

/**
 * How long a miss waits for an agent of its group to connect when none is (a server just
 * restarted: its agents come back within their back-off) before it fails E_NO_WORKERS.
 */
export const NO_AGENT_WAIT_MS = 5_000;

interface Pending {
  readonly job: Job;
  readonly resolve: (value: unknown) => void;
  readonly reject: (err: Error) => void;
  timer: NodeJS.Timeout;
  holder: AgentIdentity | null;
  readonly takeSpan: TakeSpan;
}

interface Waiter {
  readonly agent: AgentIdentity;
  readonly hand: (pending: Pending | null) => void;
}

/**
 * {@link AgentDispatch} in one server process. A job waits for an agent of its group, then is
 * held by the agent that took it until it reports or `timeoutMs` passes from submission (the
 * same bound as an in-process run): then it fails with E_EXECUTOR_TIMEOUT and its token dies,
 * so an agent that died mid-job cannot keep reading as that job's viewer. A job is never
 * handed to a second agent: it is the agent's to finish or to time out.
 */
export class InProcessAgentDispatch implements AgentDispatch {
  readonly presence = new AgentPresence();
  readonly #jobTokens: JobTokens;
  readonly #timeoutMs: number;
  readonly #noAgentWaitMs: number;
  /** Until then a miss waits for an agent at least that long (the server just started). */
  readonly #graceUntil: number;
  #ending = false;
  readonly #queued = new Map<string, Pending[]>();
  readonly #waiting = new Map<string, Waiter[]>();
  readonly #held = new Map<string, Pending>();

  constructor(
    jobTokens: JobTokens,
    options: {
      timeoutMs: number;
      /** @default {@link NO_AGENT_WAIT_MS} */
      noAgentWaitMs?: number;
      /**
       * For this long after the dispatch is made, a miss waits for an agent until then at least
       * (they start beside the server, or reconnect after its restart). @default 0
       */
      startGraceMs?: number;
    },
  ) {
    this.#jobTokens = jobTokens;
    this.#timeoutMs = options.timeoutMs;
    this.#noAgentWaitMs = options.noAgentWaitMs ?? NO_AGENT_WAIT_MS;
    this.#graceUntil = Date.now() + (options.startGraceMs ?? 0);
  }

  async run(job: Job, group: string): Promise<unknown> {
    // No agent to take it: say so now, not after the job's timeout (which blames the runnable).
    const waitMs = Math.max(this.#noAgentWaitMs, this.#graceUntil - Date.now());
    if (!(await this.presence.whenConnected(job.workspace, group, waitMs))) {
      throw new NoWorkersError(
        `no agent of group ${group} is connected to this server: start one (worker --agent) with a token of that group`,
      );
    }
    return new Promise((resolve, reject) => {
      const pending: Pending = {
        job,
        resolve,
        reject,
        holder: null,
        takeSpan: startTakeSpan(),
        timer: setTimeout(() => {
          this.#drop(pending, group);
          reject(
            new ExecutorTimeoutError(
              pending.holder === null
                ? `no agent of group ${group} took the job within ${this.#timeoutMs} ms`
                : `the agent did not finish the job within ${this.#timeoutMs} ms`,
            ),
          );
        }, this.#timeoutMs),
      };
      const key = keyOf(job.workspace, group);
      const waiter = this.#waiting.get(key)?.shift();
      if (waiter !== undefined) waiter.hand(pending);
      else this.#queue(key).push(pending);
    });
  }

  take(agent: AgentIdentity, waitMs: number, signal: AbortSignal): Promise<TakenJob | null> {
    const key = keyOf(agent.workspace, agent.group);
    const closeTake = this.presence.taking(agent);
    const next = this.#queued.get(key)?.shift();
    if (next !== undefined) {
      closeTake();
      return Promise.resolve(this.#hold(next, agent));
    }
    if (waitMs <= 0 || signal.aborted || this.#ending) {
      closeTake();
      return Promise.resolve(null);
    }
    return new Promise((resolve) => {
      const waiters = this.#waiting.get(key) ?? [];
      this.#waiting.set(key, waiters);
      const leave = () => {
        closeTake();
        clearTimeout(timer);
        signal.removeEventListener('abort', onAbort);
        const at = waiters.indexOf(waiter);
        if (at !== -1) waiters.splice(at, 1);
      };
      const waiter: Waiter = {
        agent,
        hand: (pending) => {
          leave();
          resolve(pending === null ? null : this.#hold(pending, agent));
        },
      };
      const onAbort = () => waiter.hand(null);
      const timer = setTimeout(onAbort, waitMs);
      signal.addEventListener('abort', onAbort, { once: true });
      waiters.push(waiter);
    });
  }

  finish(agent: AgentIdentity, jobId: string, outcome: AgentOutcome): boolean {
    this.presence.seen(agent);
    const pending = this.#held.get(jobId);
    if (pending === undefined || pending.holder?.id !== agent.id) return false;
    if (pending.job.workspace !== agent.workspace) return false;
    this.#drop(pending, agent.group);
    if (outcome.ok) pending.resolve(outcome.value);
    else pending.reject(failureOf(outcome.code, outcome.message, outcome.sqlstate));
    return true;
  }

  beat(agent: AgentIdentity, jobId: string): boolean {
    // In process the bound runs from submission: a beat changes nothing but says if it is held.
    this.presence.seen(agent);
    const pending = this.#held.get(jobId);
    return pending !== undefined && pending.holder?.id === agent.id;
  }

  jobOfToken(agent: AgentIdentity, token: string): Job | null {
    const job = this.#jobTokens.jobOfToken(token);
    if (job === null) return null;
    const pending = this.#held.get(job.id);
    // Only the agent that holds the job, in the job's workspace: a token that leaked to another
    // agent (or was sent to the proxy by a job of another workspace) answers nothing.
    if (pending === undefined || pending.holder?.id !== agent.id || pending.job !== job)
      return null;
    return job.workspace === agent.workspace ? job : null;
  }

  endTakes(): void {
    this.#ending = true;
    for (const waiters of this.#waiting.values()) for (const w of [...waiters]) w.hand(null);
  }

  close(): void {
    this.endTakes();
    const all = [...this.#held.values(), ...[...this.#queued.values()].flat()];
    for (const waiters of this.#waiting.values()) for (const w of [...waiters]) w.hand(null);
    for (const pending of all) {
      this.#drop(pending, null);
      pending.reject(
        new ExecutorFailedError('the server stopped before an agent finished the job'),
      );
    }
  }

  #hold(pending: Pending, agent: AgentIdentity): TakenJob {
    pending.holder = agent;
    this.presence.holds(agent, 1);
    this.#held.set(pending.job.id, pending);
    const traceparent = pending.takeSpan.taken();
    return {
      job: pending.job,
      jobToken: this.#jobTokens.issue(pending.job),
      ...(traceparent === null ? {} : { traceparent }),
    };
  }

  /** Forgets a job wherever it is, and kills its token. */
  #drop(pending: Pending, group: string | null): void {
    clearTimeout(pending.timer);
    pending.takeSpan.dropped();
    if (this.#held.get(pending.job.id) === pending) {
      this.#held.delete(pending.job.id);
      if (pending.holder !== null) this.presence.holds(pending.holder, -1);
      this.#jobTokens.revoke(pending.job);
    }
    for (const [key, queue] of this.#queued) {
      if (group !== null && key !== keyOf(pending.job.workspace, group)) continue;
      const at = queue.indexOf(pending);
      if (at !== -1) queue.splice(at, 1);
    }
  }

  #queue(key: string): Pending[] {
    let queue = this.#queued.get(key);
    if (queue === undefined) {
      queue = [];
      this.#queued.set(key, queue);
    }
    return queue;
  }
}

/** The executor the server's cache wraps when jobs run on agents of `group`. */
export function agentExecutor(dispatch: AgentDispatch, group: string): JobExecutor {
  return {
    async run(job: Job): Promise<JobResult> {
      return agentResult(job, await dispatch.run(job, group));
    },
  };
}

/** The result of `job` from the value an agent reported (its bytes derived once, on demand). */
export function agentResult(job: Job, value: unknown): JobResult {
  let json: Uint8Array | undefined;
  return {
    jobId: job.id,
    value,
    fromCache: false,
    json: () => (json ??= Buffer.from(JSON.stringify(value) ?? 'null')),
  };
}

function keyOf(workspace: string, group: string): string {
  return `${workspace}\u0000${group}`;
}
