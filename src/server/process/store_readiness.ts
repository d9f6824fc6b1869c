import type { Cluster, Redis } from 'ioredis';

/**
 * What `/readyz` reports for the Redis tier: `ok`, or the state that makes runs go uncached.
 *
 * A single node is ready when it answers PING. A Cluster is ready only when the client has its
 * slot map and *every* master it knows answers `CLUSTER INFO` with `cluster_state:ok`: a PING to
 * one node answers even while the Cluster refuses writes (a master down, slots uncovered), and
 * then nearly every run goes uncached while the process looks ready. The states:
 * - `down`: a node (the only one, or a master) does not answer within `timeoutMs`;
 * - `fail`: a master answers but says the Cluster is not serving (`cluster_state:fail`);
 * - the client's own status (`connecting`, `reconnecting`, `end`, …) when it is not ready.
 */
export function redisReadiness(redis: Redis | Cluster, timeoutMs: number): () => Promise<string> {
  // Told by shape (`isCluster`), not `instanceof`: the client may come from another ioredis.
  if (!redis.isCluster) {
    const client = redis as Redis;
    return async () => ((await answer(client.ping(), timeoutMs)) === 'PONG' ? 'ok' : 'down');
  }
  const client = redis as Cluster;
  return async () => {
    if (client.status !== 'ready') return client.status;
    const masters = client.nodes('master');
    if (masters.length === 0) return 'down';
    const states = await Promise.all(
      masters.map(async (node) => {
        // Node connections are lazy (status `wait` until first used): ask, within the timeout.
        const info = await answer(node.cluster('INFO') as Promise<unknown>, timeoutMs);
        if (typeof info !== 'string') return 'down';
        return /^cluster_state:(\w+)/m.exec(info)?.[1] ?? 'down';
      }),
    );
    return states.find((state) => state !== 'ok') ?? 'ok';
  };
}

/** The command's answer, or undefined if it failed or took longer than `timeoutMs`. */
async function answer<T>(command: Promise<T>, timeoutMs: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>((resolve) => {
    timer = setTimeout(() => resolve(undefined), timeoutMs);
  });
  try {
    return await Promise.race([command.catch(() => undefined), late]);
  } finally {
    clearTimeout(timer);
  }
}
