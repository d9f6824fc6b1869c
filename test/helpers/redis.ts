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

/** A SET the server ran: its key and arguments, the client address it came from and its name. */
export interface SeenSet {
  readonly key: string;
  readonly args: readonly string[];
  readonly source: string;
  /** The connection's name (`connectionName`, CLIENT SETNAME), '' when it has none. */
  readonly name: string;
}

/**
 * The SET commands the server behind `raw` ran while `act` ran, in the order it ran them, each
 * with the connection it came from (MONITOR names the address; CLIENT LIST, taken once the act is
 * over, names the connection there). Reads the server itself, not any client of ours.
 */
export async function setsDuring(raw: Redis, act: () => Promise<unknown>): Promise<SeenSet[]> {
  // Not `raw.monitor()`: ioredis marks a connection as monitoring a microtask after MONITOR's
  // +OK, so monitor lines of other clients' commands read in the same chunk are taken for
  // replies to no command, and `monitor()` rejects ("Command queue state error") — whenever
  // another client is busy (another file's clean-up, on a shared Redis). With an error
  // listener first, those lines (all from before `act`) are dropped and monitoring goes on.
  const monitor = raw.duplicate({ monitor: true, lazyConnect: true });
  monitor.on('error', () => {});
  const monitoring = new Promise<void>((resolve) => monitor.once('monitoring', () => resolve()));
  await monitor.connect();
  await monitoring;
  const seen: Omit<SeenSet, 'name'>[] = [];
  const marker = `sets-during-${randomBytes(4).toString('hex')}`;
  const done = new Promise<void>((resolve) => {
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      const command = args[0]?.toLowerCase();
      if (command === 'set') seen.push({ key: args[1] ?? '', args, source });
      else if (command === 'ping' && args[1] === marker) resolve();
    });
  });
  try {
    await act();
    // MONITOR shows what the server ran, in order: a PING sent after the act is seen after it.
    await raw.ping(marker);
    await done;
  } finally {
    monitor.disconnect();
  }
  const names = new Map<string, string>();
  for (const line of String(await raw.client('LIST')).split('\n')) {
    const addr = /addr=(\S+)/.exec(line)?.[1];
    if (addr !== undefined) names.set(addr, /name=(\S*)/.exec(line)?.[1] ?? '');
  }
  return seen.map((s) => ({ ...s, name: names.get(s.source) ?? '' }));
}
