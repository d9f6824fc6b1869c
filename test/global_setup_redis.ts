import { Redis } from 'ioredis';
import type {} from 'vitest';
import type { TestProject } from 'vitest/node';

declare module 'vitest' {
  export interface ProvidedContext {
    redisUrl: string;
  }
}

/** Checks the Redis the suite will use, and fails the run (never skips) when it is not there. */
export default async function setup(project: TestProject): Promise<void> {
  const redisUrl = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
  const client = new Redis(redisUrl, {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    retryStrategy: () => null,
  });
  client.on('error', () => {});
  try {
    await client.connect();
    await client.ping();
  } catch (err) {
    throw new Error(
      `Redis is not reachable at ${redisUrl} (set REDIS_URL): ${(err as Error).message}. ` +
        'Integration tests need a real Redis; they do not skip.',
    );
  } finally {
    client.disconnect();
  }
  project.provide('redisUrl', redisUrl);
}
