import type { RunnableDefinition } from '../src/index.js';

/** About 1 ms of CPU and a small result: the runnable of the queue scenarios. */
export const QUEUE_BENCH_RUNNABLES: Record<string, RunnableDefinition> = {
  work: {
    // An explicit version: the bench and its worker processes must agree on it.
    hash: 'bench-work-v1',
    cacheTtlS: 300,
    fn: async (args) => {
      // VC_QUEUE_BENCH_SPIN_MS=0 (queue_cpu.ts, inherited by its worker): no work at all, so
      // what is left per miss is the queue's own cost.
      const until = performance.now() + Number(process.env['VC_QUEUE_BENCH_SPIN_MS'] ?? 1);
      let spins = 0;
      while (performance.now() < until) spins++;
      return {
        n: args['n'] ?? null,
        spins: spins > 0,
        rows: Array.from({ length: 20 }, (_, i) => i),
      };
    },
  },
};

export const QUEUE_BENCH_SECRET = 'bench-queue-secret-0123456789abcdef-0123';
