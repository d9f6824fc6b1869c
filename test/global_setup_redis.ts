import { Redis } from 'ioredis';
import type {} from 'vitest';
import type { TestProject } from 'vitest/node';
import { redisContainer } from './helpers/containers.js';

declare module 'vitest' {
  export interface ProvidedContext {
    redisUrl: string;
  }
}

/**
 * Checks the Redis the suite will use — REDIS_URL (default 127.0.0.1:6379), or a testcontainers
 * Redis with VC_TEST_REDIS=container — and fails the run (never skips) when it is not there.
 */
export default async function setup(
  project: TestProject,
): Promise<(() => Promise<void>) | undefined> {
  let stop: (() => Promise<void>) | undefined;
  let redisUrl = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
  if (process.env['VC_TEST_REDIS'] === 'container') {
    const started = await redisContainer();
    redisUrl = started.url;
    stop = started.stop;
  }
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
  return stop;
}
