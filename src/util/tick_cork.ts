import type { Writable } from 'node:stream';

/** The parts of an ioredis client `corkForTick` reads (a `Cluster` has no single stream). */
export interface CorkableClient {
  readonly isCluster?: boolean;
  readonly status?: string;
  readonly stream?: Writable;
}

/**
 * Holds a single-node client's socket corked until the current tick ends, so the commands sent
 * in it — ours and whatever else shares the connection, in their order — leave in one `writev`
 * instead of one write syscall each (on loopback, the costliest step of a small command). A
 * socket someone already holds corked is left alone (not corked twice): its holder uncorks it
 * within the same turn of the event loop (`RedisCacheStore` batching a turn's GETs, at its end).
 * A cluster, or a client not connected, is not corked (its commands queue in ioredis).
 */
export function corkForTick(client: CorkableClient): void {
  if (client.isCluster === true || client.status !== 'ready') return;
  const stream = client.stream;
  if (stream === undefined || !stream.writable || stream.writableCorked > 0) return;
  stream.cork();
  // The stream corked is the one uncorked, even if the client reconnects meanwhile.
  process.nextTick(uncork, stream);
}

function uncork(stream: Writable): void {
  stream.uncork();
}

/**
 * Sends what a single-node client's socket holds corked now, instead of at the end of the tick
 * (a later command of the same tick then leaves in a write of its own): for a command that must
 * reach Redis ahead of the tick's others, not merely before them in the same write.
 */
export function uncorkNow(client: CorkableClient): void {
  const stream = client.stream;
  if (client.isCluster === true || stream === undefined) return;
  // The tick's own uncork then finds nothing corked (Writable.uncork at 0 does nothing).
  while (stream.writableCorked > 0) stream.uncork();
}
