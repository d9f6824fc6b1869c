import { jobScope, withJobScope } from '../util/job_scope.js';
import type { AffinityClient } from '../util/write_affinity.js';

/**
 * What a queue worker knows of the job it is running, for the code that job runs (the job's
 * child runs over HTTP, the job tokens it is issued): both come from the sealed record or the
 * queue the job was taken from, never from the message's clear fields.
 */
export interface QueuedRun {
  /** The job's nesting depth: 0 for a job the server queued, d for a child of a depth d-1 job. */
  readonly depth: number;
  /**
   * Where the job's child runs over HTTP go: the address the enqueuing server advertised
   * (sealed in the record), or null when it advertised none (a server of an earlier version).
   */
  readonly childUrl: string | null;
}

/**
 * The deepest queue a job-token child goes to. A child of a job at this depth runs on the
 * server that receives it, in process (as every job-token child did before), so the chain of
 * slots a parent may wait on is bounded: a depth-d job waits only on depth-(d+1) slots, which
 * no parent of its chain holds.
 */
export const CHILD_QUEUE_DEPTHS = 3;

/** The queued job this code runs for (worker side), or undefined outside a queued job. */
export function queuedRun(): QueuedRun | undefined {
  return jobScope()?.queued as QueuedRun | undefined;
}

/**
 * Runs `fn` as the queued job `run` (everything it starts sees {@link queuedRun}), its cache
 * writes free to go on `writeVia` (write_affinity.ts): one scope for both (job_scope.ts).
 */
export function runQueued<T>(run: QueuedRun, writeVia: AffinityClient, fn: () => T): T {
  return withJobScope({ queued: run, writeVia }, fn);
}

/**
 * The queue of a nesting depth: the base name for depth 0, `NAME-child-D` below it (BullMQ
 * refuses `:` in a name). A record is sealed to its queue's name, so a message copied to
 * another depth opens nowhere.
 */
export function childQueueName(name: string, depth: number): string {
  if (!Number.isInteger(depth) || depth < 0 || depth > CHILD_QUEUE_DEPTHS)
    throw new TypeError(`depth must be an integer from 0 to ${CHILD_QUEUE_DEPTHS}`);
  return depth === 0 ? name : `${name}-child-${depth}`;
}
