import { randomBytes } from 'node:crypto';
import { once } from 'node:events';
import { Cluster, Redis, type RedisOptions } from 'ioredis';

/** A key prefix no other test file (or run) shares. */
export function uniquePrefix(file: string): string {
  return `vc-test:${file}:${process.pid}:${randomBytes(4).toString('hex')}:`;
}

/** A raw client for setup and inspection, connected before it is returned. */
export async function rawClient(url: string, options: RedisOptions = {}): Promise<Redis> {
  const client = new Redis(url, { lazyConnect: true, maxRetriesPerRequest: 1, ...options });
  client.on('error', () => {});
  await client.connect();
  return client;
}

/** Resolves on the client's next 'ready' (now, if it already is). */
export async function ready(client: Redis | Cluster): Promise<void> {
  if (client.status === 'ready') return;
  await once(client, 'ready');
}

/** Deletes every key under `prefix` (on every master of a cluster). */
export async function deleteKeys(client: Redis | Cluster, prefix: string): Promise<number> {
  const nodes = client instanceof Cluster ? client.nodes('master') : [client];
  let deleted = 0;
  for (const node of nodes) {
    let cursor = '0';
    do {
      const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 1000);
      cursor = next;
      // one DEL per key: in a cluster the keys of one batch may live in different slots
      for (const key of keys) deleted += await node.del(key);
    } while (cursor !== '0');
  }
  return deleted;
}

async function serverMs(client: Redis | Cluster): Promise<number> {
  const [seconds, micros] = await client.time();
  return Number(seconds) * 1000 + Number(micros) / 1000;
}

/**
 * Waits until the Redis server's own clock has moved `ms` milliseconds, which is the clock its
 * key expiry runs on. Each check is a real round trip, so this never sleeps on a timer.
 */
export async function elapseOnServer(client: Redis | Cluster, ms: number): Promise<void> {
  const until = (await serverMs(client)) + ms;
  while ((await serverMs(client)) < until) {
    // keep asking: each TIME is a network round trip
  }
}

/** host and port of a redis:// URL, and the URL with them replaced (for pointing at a proxy). */
export function redisAddress(url: string): {
  host: string;
  port: number;
  via(port: number): string;
} {
  const parsed = new URL(url);
  return {
    host: parsed.hostname || '127.0.0.1',
    port: Number(parsed.port || 6379),
    via(port: number) {
      const copy = new URL(url);
      copy.hostname = '127.0.0.1';
      copy.port = String(port);
      return copy.toString();
    },
  };
}
