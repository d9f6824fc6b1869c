/**
 * Inputs shared by the scenarios: realistic payloads, many viewers, one Redis, and an executor
 * that fails the run if a "hit" ever executes.
 */
import { Redis } from 'ioredis';
import { cachedResultPath, type Job, type JobExecutor, type JobResult } from '../src/index.js';
import { BenchInvariantError, type Scenario } from './helpers.js';
import { localRedisPid } from './machine_cpu.js';

export const REDIS_URL = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
/** Distinct viewers cycled through by every scenario, so keys are as varied as in production. */
export const VIEWERS = 1000;
/** Long enough never to expire during a run; short enough that a crashed run cleans itself up. */
export const TTL_S = 3600;

/** Everything this process writes to Redis starts with this, and is deleted at the end. */
export const RUN_PREFIX = `vc-bench:${process.pid}:`;

/** A ten-field args object, the shape SPEC's key-derivation target is stated for. */
export const TEN_FIELD_ARGS = Object.freeze({
  region: 'emea',
  limit: 50,
  offset: 0,
  sort: 'created_at',
  desc: true,
  q: 'widget',
  from: '2026-01-01',
  to: '2026-12-31',
  status: ['open', 'paid'],
  customer: 1234,
});

/** One payload size with its viewers' jobs. */
export interface SizeFixture {
  /** Table label: `1 KiB`, `64 KiB`. */
  readonly label: string;
  readonly bytes: number;
  /** The result's JSON, exactly `bytes` long. */
  readonly json: Buffer;
  readonly text: string;
  /** One job per viewer: same runnable and args, different viewer. */
  readonly jobs: readonly Job[];
  /** `cachedResultPath(jobs[v])`. */
  readonly keys: readonly string[];
}

/** JSON of order rows, padded to exactly `bytes` bytes. */
export function payloadJson(bytes: number): Buffer {
  const rows: object[] = [];
  const encode = (pad: string) => JSON.stringify({ rows, pad });
  for (let i = 0; ; i++) {
    const row = {
      id: i,
      region: i % 2 === 0 ? 'emea' : 'amer',
      customer: `customer-${(i * 7919) % 10_000}`,
      amount: Math.round(((i * 37.5) % 1000) * 100) / 100,
      status: i % 3 === 0 ? 'open' : 'paid',
      created_at: `2026-01-${String((i % 28) + 1).padStart(2, '0')}T10:00:00Z`,
    };
    rows.push(row);
    if (encode('').length > bytes) {
      rows.pop();
      break;
    }
  }
  const text = encode('x'.repeat(bytes - encode('').length));
  if (Buffer.byteLength(text) !== bytes) throw new Error(`payload is not ${bytes} bytes`);
  return Buffer.from(text);
}

export function sizeFixture(bytes: number, viewers = VIEWERS): SizeFixture {
  const label = bytes >= 1024 ? `${bytes / 1024} KiB` : `${bytes} B`;
  const json = payloadJson(bytes);
  const jobs: Job[] = [];
  for (let v = 0; v < viewers; v++) {
    jobs.push({
      id: `bench-${v}`,
      workspace: 'bench',
      runnable: { path: `f/orders/list_${bytes}`, hash: 'c0ffee01' },
      args: TEN_FIELD_ARGS,
      perms: { email: 'publisher@example.com', endUserEmail: `viewer${v}@example.com` },
      cacheTtlS: TTL_S,
    });
  }
  return {
    label,
    bytes,
    json,
    text: json.toString('utf8'),
    jobs,
    keys: jobs.map((job) => cachedResultPath(job)),
  };
}

/**
 * The executor behind the cache. While filling it returns the payload; once armed, any
 * execution is a bug in the benchmark (a "hit" that was not one) and fails the run.
 */
export class GuardedExecutor implements JobExecutor {
  executions = 0;
  #armed = false;

  constructor(
    readonly name: string,
    readonly json: Buffer,
  ) {}

  arm(): void {
    this.#armed = true;
  }

  run(job: Job): Promise<JobResult> {
    this.executions++;
    if (this.#armed) {
      return Promise.reject(
        new BenchInvariantError(`${this.name}: a measured "hit" executed the job`),
      );
    }
    const json = this.json;
    return Promise.resolve({ jobId: job.id, value: null, fromCache: false, json: () => json });
  }
}

/** What a scenario file hands back: its scenarios and how to release what it opened. */
export interface ScenarioSet {
  readonly scenarios: readonly Scenario[];
  close(): Promise<void>;
}

/**
 * The one ioredis client (default options) every Redis row goes through: the raw GET baseline,
 * our store (which borrows it) and BentoCache's L2. One connection on purpose: on the reference
 * machine a GET whose reply exceeds 64 KiB takes either ~70 µs or ~300 µs depending on the TCP
 * connection it travels on, in runs lasting seconds, so two connections measured side by side
 * can differ by 4× for reasons that have nothing to do with the code above them.
 */
export function sharedRedis(): Redis {
  return rawRedis();
}

/** A plain ioredis client on the bench Redis, with default options. */
export function rawRedis(): Redis {
  const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 1 });
  client.on('error', () => {});
  return client;
}

/**
 * The pid of the bench Redis when it runs on this machine, else `null`: its CPU serves the
 * measured GETs, so the quiet-block check counts it as ours, not as another process's.
 */
export async function redisServerPid(client: Redis): Promise<number | null> {
  return localRedisPid(await client.info('server'));
}

/** Deletes every key this run wrote (SCAN + UNLINK under {@link RUN_PREFIX}). */
export async function deleteRunKeys(client: Redis): Promise<number> {
  return deleteKeys(client, `${RUN_PREFIX}*`);
}

/** Deletes every key matching `match` (a SCAN pattern); how many it deleted. */
export async function deleteKeys(client: Redis, match: string): Promise<number> {
  let cursor = '0';
  let deleted = 0;
  do {
    const [next, keys] = await client.scan(cursor, 'MATCH', match, 'COUNT', 1000);
    cursor = next;
    if (keys.length > 0) deleted += await client.unlink(...keys);
  } while (cursor !== '0');
  return deleted;
}
