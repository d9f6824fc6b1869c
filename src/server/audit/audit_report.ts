/**
 * The audit's report: what `viewer-cache audit` prints, writes as JSON, JUnit and HTML, and
 * what a user's own test reads. Plain data.
 */
import type { PolicyFinding } from '../../index.js';

export type AuditStatus = 'pass' | 'warn' | 'fail';

/** One (runnable, viewer) of the matrix. */
export interface AuditCell {
  readonly runnable: string;
  readonly viewer: string;
  readonly status: AuditStatus;
  /** Rows served (an array's length; 1 for another answer), or null when refused. */
  readonly rows: number | null;
  /** The refusal's code, when refused. */
  readonly code?: string;
  /** The second request: a hit, a miss, or not cached at all (refused, or no TTL). */
  readonly cache: 'hit' | 'miss' | 'uncached';
  /** Why it warns or fails; what was checked when it passes. */
  readonly reasons: readonly string[];
}

/** A check about a runnable across viewers (key separation, varies by viewer). */
export interface AuditFinding {
  readonly check:
    | 'differential-isolation'
    | 'key-separation'
    | 'no-viewer-no-rows'
    | 'per-recipient'
    | 'varies-by-viewer'
    | 'expectation';
  readonly runnable: string;
  readonly status: AuditStatus;
  readonly message: string;
}

export interface AuditReport {
  /** The apps module audited (`demo` for the demo). */
  readonly apps: string;
  readonly workspace: string;
  readonly startedAt: string;
  readonly durationMs: number;
  readonly viewers: ReadonlyArray<{ label: string; kind: string; roles: readonly string[] }>;
  readonly runnables: ReadonlyArray<{
    path: string;
    apps: readonly string[];
    public: boolean;
    /** `datatable?as=…` references the runnable was seen to ask for. */
    reads: readonly string[];
  }>;
  readonly cells: readonly AuditCell[];
  readonly findings: readonly AuditFinding[];
  readonly lints: readonly PolicyFinding[];
  readonly summary: {
    readonly pass: number;
    readonly warn: number;
    readonly fail: number;
    /** Lint findings the user marked intended. */
    readonly intended: number;
  };
  /** fail when anything failed; warn when something warned; else pass. */
  readonly status: AuditStatus;
  /** Where the cached runs ran: in this process, or through a queue and its worker. */
  readonly execution: 'in-process' | 'queue';
  /** In queue mode: the jobs the audit's worker took (each a miss of the audit's caches). */
  readonly workerJobs?: number;
}

/** The worse of two statuses. */
export function worse(a: AuditStatus, b: AuditStatus): AuditStatus {
  const rank = { pass: 0, warn: 1, fail: 2 } as const;
  return rank[a] >= rank[b] ? a : b;
}
