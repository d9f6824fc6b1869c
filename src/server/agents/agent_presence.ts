import type { AgentIdentity } from '../credentials/agent_tokens.js';

/**
 * How long an agent counts as connected after its last request when it has no take open. An
 * agent re-takes as soon as a take answers, so a live one is seldom outside a take for longer
 * than a job runs (it holds the job meanwhile, which counts too).
 */
export const AGENT_PRESENCE_MS = 5_000;

interface Seen {
  readonly workspace: string;
  readonly group: string;
  /** Takes open now (a long-poll waiting on the server). */
  open: number;
  /** Jobs it holds now. */
  holding: number;
  lastSeen: number;
}

/**
 * Which agents are connected, per workspace and group: an agent with a take open or a job held,
 * or seen within {@link AGENT_PRESENCE_MS}. What `/readyz` reports, and what lets a miss with no
 * agent to run it fail at once (E_NO_WORKERS) instead of waiting out the job's timeout.
 */
export class AgentPresence {
  readonly #agents = new Map<string, Seen>();
  readonly #arrivals = new Set<() => void>();
  readonly #now: () => number;

  constructor(options: { now?: () => number } = {}) {
    this.#now = options.now ?? Date.now;
  }

  /** A take of `agent` opened; call the returned function once when it closes. */
  taking(agent: AgentIdentity): () => void {
    const seen = this.#seen(agent);
    seen.open++;
    this.#arrived();
    let closed = false;
    return () => {
      if (closed) return;
      closed = true;
      seen.open--;
      seen.lastSeen = this.#now();
    };
  }

  /** `agent` holds one more job (+1) or one fewer (-1). */
  holds(agent: AgentIdentity, delta: 1 | -1): void {
    const seen = this.#seen(agent);
    seen.holding = Math.max(0, seen.holding + delta);
  }

  /** `agent` made a request (a beat, a finish, a query). */
  seen(agent: AgentIdentity): void {
    this.#seen(agent);
  }

  /** Agents connected for `workspace` and `group`. */
  count(workspace: string, group: string): number {
    let n = 0;
    const now = this.#now();
    for (const seen of this.#agents.values()) {
      if (seen.workspace === workspace && seen.group === group && this.#live(seen, now)) n++;
    }
    return n;
  }

  /** Connected agents per `workspace/group` (only those with at least one). */
  groups(): Record<string, number> {
    const out: Record<string, number> = {};
    const now = this.#now();
    for (const [id, seen] of this.#agents) {
      if (!this.#live(seen, now)) {
        if (seen.open === 0 && seen.holding === 0) this.#agents.delete(id);
        continue;
      }
      const key = `${seen.workspace}/${seen.group}`;
      out[key] = (out[key] ?? 0) + 1;
    }
    return out;
  }

  /**
   * Resolves true as soon as an agent of `workspace` and `group` is connected, false after
   * `waitMs` without one.
   */
  whenConnected(workspace: string, group: string, waitMs: number): Promise<boolean> {
    if (this.count(workspace, group) > 0) return Promise.resolve(true);
    return new Promise((resolve) => {
      const check = () => {
        if (this.count(workspace, group) === 0) return;
        done(true);
      };
      const done = (found: boolean) => {
        clearTimeout(timer);
        this.#arrivals.delete(check);
        resolve(found);
      };
      const timer = setTimeout(() => done(false), waitMs);
      this.#arrivals.add(check);
    });
  }

  #live(seen: Seen, now: number): boolean {
    return seen.open > 0 || seen.holding > 0 || now - seen.lastSeen < AGENT_PRESENCE_MS;
  }

  #seen(agent: AgentIdentity): Seen {
    let seen = this.#agents.get(agent.id);
    if (seen === undefined) {
      seen = { workspace: agent.workspace, group: agent.group, open: 0, holding: 0, lastSeen: 0 };
      this.#agents.set(agent.id, seen);
    }
    seen.lastSeen = this.#now();
    return seen;
  }

  #arrived(): void {
    for (const check of [...this.#arrivals]) check();
  }
}
