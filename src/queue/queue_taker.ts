import { randomBytes } from 'node:crypto';
import { hostname } from 'node:os';
import { type Duration, resolveDuration } from '../duration.js';
import { type Logger, silentLogger } from '../logger.js';
import type { QueueRedis } from './queue_executor.js';
import { QUEUE_DEFAULTS } from './queue_names.js';
import { QueueKeys } from './queue_seal.js';

/** What every taker of queued jobs is given: a database worker, or a server taking for agents. */
export interface QueueTakerOptions {
  /** The Redis the servers queue on (duplicated: BullMQ's blocking reads need their own). */
  redis: QueueRedis;
  /** The deployment secret (VIEWER_CACHE_SECRET_KEY): messages that do not verify are refused. */
  secretKey: string;
  /** How long a taken job's lock lives without renewal (retried once after). @default '30s' */
  lockDuration?: Duration;
  /** @default '{viewer-cache}' */
  prefix?: string;
  /** @default 'jobs' */
  name?: string;
  /** @default silent */
  logger?: Logger;
}

/** The options a taker resolves, checked once, and its id (host, pid, random: one per taker). */
export function queueTaker(options: QueueTakerOptions) {
  const { redis } = options;
  if (typeof redis?.duplicate !== 'function')
    throw new TypeError('redis must be an ioredis Redis or Cluster client');
  return {
    redis,
    keys: new QueueKeys(options.secretKey),
    lockMs: resolveDuration(options.lockDuration ?? '30s', 'lockDuration'),
    prefix: options.prefix ?? QUEUE_DEFAULTS.prefix,
    name: options.name ?? QUEUE_DEFAULTS.name,
    logger: options.logger ?? silentLogger,
    id: `${hostname()}:${process.pid}:${randomBytes(4).toString('hex')}`,
  };
}
