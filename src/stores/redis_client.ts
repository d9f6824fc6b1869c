import type { Cluster, Redis } from 'ioredis';

/**
 * Whether `value` is an ioredis client — a Redis or a Cluster, of ioredis 5.x or 6.x — told by
 * its shape, not by `instanceof`: the application's ioredis is not always the very module this
 * package imports (another major version, or a second copy in node_modules), and a class
 * identity check refused a good client with a misleading error. BullMQ and BentoCache accept a
 * connection the same way.
 */
export function isIoredisClient(value: unknown): value is Redis | Cluster {
  if (value === null || typeof value !== 'object') return false;
  const client = value as Record<string, unknown>;
  return (
    typeof client['isCluster'] === 'boolean' &&
    typeof client['getBuffer'] === 'function' &&
    typeof client['duplicate'] === 'function' &&
    typeof client['on'] === 'function'
  );
}

/** Whether an ioredis client is a Cluster (ioredis sets `isCluster` on both kinds). */
export function isCluster(client: Redis | Cluster): client is Cluster {
  return client.isCluster;
}
