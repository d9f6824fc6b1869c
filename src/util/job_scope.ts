import { AsyncLocalStorage } from 'node:async_hooks';

/**
 * What the code of a queued job sees without being handed it, through every await: where the
 * job came from (queued_run.ts) and the connection its cache writes may go on
 * (write_affinity.ts). Both live in this one AsyncLocalStorage because, on Node 20, each storage
 * in use costs every promise the process makes — BullMQ's and ioredis' as much as the job's — a
 * hook call and a property (measured about 0.06 µs a promise per storage), and a queued miss
 * makes about 92 promises on its worker: one storage instead of two saves about 5 µs of CPU per
 * job (CHANGELOG).
 */
export interface JobScope {
  /** The queued run (queued_run.ts), read back there as its own type. */
  readonly queued?: object;
  /** The connection a store may write on instead of its own (write_affinity.ts). */
  readonly writeVia?: object;
}

const current = new AsyncLocalStorage<JobScope>();

/** The scope of the code running now, or undefined outside one. */
export function jobScope(): JobScope | undefined {
  return current.getStore();
}

/** Runs `fn` (and everything it starts) in `scope`. */
export function withJobScope<T>(scope: JobScope, fn: () => T): T {
  return current.run(scope, fn);
}
