import { jobScope, withJobScope } from './job_scope.js';

/*
 * A Redis connection the code running now may send its cache writes on instead of the store's
 * own, when both reach the same server as the same user (a queue worker's connection, for the
 * entry of the job it runs). On this machine class every socket write and every reply read is a
 * system call of tens of microseconds: a worker's entry written on the store's connection cost a
 * `writev` and a read of its own, and the `writev`, sent first, delayed the answer's. On the
 * worker's connection the entry leaves in the one `writev` that carries the claim's finish and
 * BullMQ's completion, and Redis runs it before them (one connection's commands run in order).
 * It is carried in the job's scope (job_scope.ts), beside the queued run.
 */

/** What a store reads of a candidate connection (an ioredis single-node client). */
export interface AffinityClient {
  readonly isCluster?: boolean;
  readonly status?: string;
  readonly options?: unknown;
}

/**
 * Runs `fn` with `client` as the connection its cache writes may go on, keeping the rest of the
 * scope it runs in (a queue worker sets both at once: `runQueued`).
 */
export function withWriteAffinity<T>(client: AffinityClient, fn: () => T): T {
  return withJobScope({ ...jobScope(), writeVia: client }, fn);
}

/**
 * The connection to send a write on instead of `own`: the one set by {@link withWriteAffinity}
 * when it is connected now and reaches the very server, database and user `own` does, with the
 * same key prefix; otherwise `null` (write on `own`). A Cluster or Sentinel client never
 * qualifies (its server is not one address).
 */
export function affinityFor(own: AffinityClient): AffinityClient | null {
  const candidate = jobScope()?.writeVia as AffinityClient | undefined;
  if (candidate === undefined || candidate === own || candidate.status !== 'ready') return null;
  let same = compatible.get(candidate)?.get(own);
  if (same === undefined) {
    same = sameServer(own, candidate);
    let byOwn = compatible.get(candidate);
    if (byOwn === undefined) {
      byOwn = new WeakMap();
      compatible.set(candidate, byOwn);
    }
    byOwn.set(own, same);
  }
  return same ? candidate : null;
}

/** Options are fixed once a client is made: each pair is compared once. */
const compatible = new WeakMap<AffinityClient, WeakMap<AffinityClient, boolean>>();

/** The options of an ioredis client that decide where its commands land and as whom. */
interface ServerOptions {
  host?: unknown;
  port?: unknown;
  path?: unknown;
  db?: unknown;
  username?: unknown;
  keyPrefix?: unknown;
  tls?: unknown;
  sentinels?: unknown;
}

export function sameServer(a: AffinityClient, b: AffinityClient): boolean {
  if (a.isCluster === true || b.isCluster === true) return false;
  const x = a.options as ServerOptions | undefined;
  const y = b.options as ServerOptions | undefined;
  if (x === undefined || y === undefined || x === null || y === null) return false;
  if (x.sentinels != null || y.sentinels != null) return false;
  // TLS settings are objects: only the absence of TLS on both sides is known to be equal.
  if (x.tls != null || y.tls != null) return false;
  return (
    x.host === y.host &&
    x.port === y.port &&
    (x.path ?? null) === (y.path ?? null) &&
    (x.db ?? 0) === (y.db ?? 0) &&
    (x.username ?? null) === (y.username ?? null) &&
    (x.keyPrefix ?? '') === (y.keyPrefix ?? '')
  );
}
