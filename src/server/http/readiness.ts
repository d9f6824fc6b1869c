/**
 * `/readyz` with a bound: every dependency is asked at once and each answer waited for at most
 * {@link READY_CHECK_MS}, so the route answers within about a second whatever PostgreSQL, Redis
 * or the fleet is doing — a dependency that does not answer in time is `timeout`, not a hang.
 *
 * A prober that retries must not pile work up on a dependency that hangs: each check keeps its
 * one question in flight and later probes wait on that same question (up to their own bound)
 * instead of asking again. Concurrent probes share one round of checks too.
 */

/** Longest `/readyz` waits for any one dependency (they are asked together). */
export const READY_CHECK_MS = 800;

/** A dependency's state: `ok`, or what is wrong (`down`, `timeout`, `none`, a client status). */
export type CheckState = string;

/** One dependency's check: resolves to its state (a rejection reads as `down`). */
export type Check = () => Promise<CheckState>;

/**
 * A check asked at most once at a time: while its question is unanswered, callers wait on it
 * (up to `boundMs` each) rather than asking again.
 */
export function boundedCheck(check: Check, boundMs = READY_CHECK_MS): Check {
  let pending: Promise<CheckState> | null = null;
  return () => {
    if (pending === null) {
      const asked = check().catch((): CheckState => 'down');
      pending = asked;
      void asked.finally(() => {
        if (pending === asked) pending = null;
      });
    }
    return within(pending, boundMs);
  };
}

/** The answer of `question`, or `timeout` once `ms` passed without one. */
function within(question: Promise<CheckState>, ms: number): Promise<CheckState> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<CheckState>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), ms);
  });
  return Promise.race([question, late]).finally(() => clearTimeout(timer));
}

/** What `/readyz` answers: 200 when every check is `ok`, else 503; the body as sent. */
export interface Readiness {
  readonly status: 200 | 503;
  readonly checks: Record<string, CheckState>;
}

/**
 * Runs every check together (each bounded, see {@link boundedCheck}); concurrent callers share
 * one round.
 */
export function createReadiness(checks: Record<string, Check>): () => Promise<Readiness> {
  const bounded = Object.entries(checks).map(
    ([name, check]) => [name, boundedCheck(check)] as const,
  );
  let round: Promise<Readiness> | null = null;
  return () => {
    round ??= Promise.all(bounded.map(async ([name, check]) => [name, await check()] as const))
      .then((states): Readiness => {
        const out = Object.fromEntries(states);
        const ok = Object.values(out).every((state) => state === 'ok');
        return { status: ok ? 200 : 503, checks: out };
      })
      .finally(() => {
        round = null;
      });
    return round;
  };
}
