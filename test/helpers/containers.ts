/**
 * Postgres and Redis from testcontainers, for machines with a Docker engine that can pull
 * images (VC_TEST_POSTGRES=container, VC_TEST_REDIS=container). The reference machine has no
 * engine, so CI uses real local servers instead; these paths fail loudly, never skip, when
 * Docker is missing. Imported lazily so that the suites do not load testcontainers otherwise.
 */
import { randomBytes } from 'node:crypto';

export interface StartedService {
  readonly url: string;
  stop(): Promise<void>;
}

/** PostgreSQL 16 (the official image enforces scram-sha-256 on TCP). */
export async function postgresContainer(): Promise<StartedService> {
  const { GenericContainer, Wait } = await import('testcontainers');
  const password = randomBytes(12).toString('hex');
  const container = await new GenericContainer(
    process.env['VC_TEST_POSTGRES_IMAGE'] ?? 'postgres:16-alpine',
  )
    .withEnvironment({ POSTGRES_PASSWORD: password })
    .withExposedPorts(5432)
    // The image starts the server twice (init, then for real): wait for the second.
    .withWaitStrategy(Wait.forLogMessage(/database system is ready to accept connections/, 2))
    .start();
  const url = `postgres://postgres:${password}@${container.getHost()}:${container.getMappedPort(5432)}/postgres`;
  return { url, stop: async () => void (await container.stop()) };
}

export async function redisContainer(): Promise<StartedService> {
  const { GenericContainer, Wait } = await import('testcontainers');
  const container = await new GenericContainer(
    process.env['VC_TEST_REDIS_IMAGE'] ?? 'redis:7-alpine',
  )
    .withExposedPorts(6379)
    .withWaitStrategy(Wait.forLogMessage(/Ready to accept connections/))
    .start();
  const url = `redis://${container.getHost()}:${container.getMappedPort(6379)}`;
  return { url, stop: async () => void (await container.stop()) };
}
