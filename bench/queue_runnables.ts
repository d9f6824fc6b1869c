import type { RunnableDefinition } from '../src/index.js';

/** The environment variable that hands the work's size to the processes a bench starts. */
const ROUNDS_VAR = 'VC_QUEUE_BENCH_SPIN_ROUNDS';

/** A fixed amount of integer work: `rounds` steps of xorshift32 (not foldable: the result is used). */
function mix(rounds: number): number {
  let x = 0x9e3779b9 | 0;
  for (let i = 0; i < rounds; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
  }
  return x;
}

/**
 * Rounds of {@link mix} taking about `ms` of CPU here, timed at its fastest of several tries (the
 * machine is shared: the fastest is the least disturbed), so that elsewhere, or later, the same
 * rounds take at least about that long.
 */
function calibrate(ms: number): number {
  if (ms <= 0) return 0;
  const trial = 200_000;
  mix(trial); // compiled before it is timed
  let best = Number.POSITIVE_INFINITY;
  for (let i = 0; i < 7; i++) {
    const t = performance.now();
    mix(trial);
    best = Math.min(best, performance.now() - t);
  }
  return Math.max(1, Math.round((ms / best) * trial));
}

/**
 * The runnable's work: a fixed number of CPU steps, the same in every process of a run — not a
 * spin for 1 ms of wall time, which is what it was. A wall-time spin does less work in a process
 * that is descheduled meanwhile, and the in-process baseline and the queue's worker (sharing two
 * cores with the callers and Redis) are not descheduled alike: measured, the spin had flattered
 * the in-process baseline (CHANGELOG).
 * The first process to load this module calibrates the count to about `VC_QUEUE_BENCH_SPIN_MS`
 * (default 1; 0: no work, leaving the queue's own cost, as `queue_cpu.ts` uses it) ms of its CPU
 * and hands it through the environment to the worker processes it starts, which inherit it.
 */
const WORK_ROUNDS = (() => {
  const handed = process.env[ROUNDS_VAR];
  if (handed !== undefined && /^\d+$/.test(handed)) return Number(handed);
  const rounds = calibrate(Number(process.env['VC_QUEUE_BENCH_SPIN_MS'] ?? 1));
  process.env[ROUNDS_VAR] = String(rounds);
  return rounds;
})();

/**
 * `VC_QUEUE_BENCH_RESULT_KIB`: the result's rows come to about that many KiB of JSON (objects of
 * an id, a name and an amount, as a data-table query returns), for reading what a large result
 * costs each process; unset, the rows are twenty small numbers.
 */
const RESULT_KIB = Number(process.env['VC_QUEUE_BENCH_RESULT_KIB'] ?? 0);
const ROWS: readonly unknown[] =
  RESULT_KIB > 0
    ? Array.from({ length: Math.round((RESULT_KIB * 1024) / 48) }, (_, i) => ({
        id: i,
        name: `row-${i.toString(36).padStart(6, '0')}`,
        amount: (i * 7919) % 100_000,
      }))
    : Array.from({ length: 20 }, (_, i) => i);

/** About 1 ms of CPU and a small result: the runnable of the queue scenarios. */
export const QUEUE_BENCH_RUNNABLES: Record<string, RunnableDefinition> = {
  work: {
    // An explicit version: the bench and its worker processes must agree on it.
    hash: 'bench-work-v1',
    cacheTtlS: 300,
    fn: async (args) => {
      const mixed = mix(WORK_ROUNDS);
      return {
        n: args['n'] ?? null,
        spins: WORK_ROUNDS > 0 && mixed !== 0,
        rows: ROWS,
      };
    },
  },
};

export const QUEUE_BENCH_SECRET = 'bench-queue-secret-0123456789abcdef-0123';
