import { createCipheriv, createDecipheriv, createHash, hkdfSync, randomBytes } from 'node:crypto';
import { QueueUnavailableError } from '../errors.js';
import type { JobTokenIssuer } from '../executor/executor.js';
import type { Job, JobPerms } from '../job.js';
import { type Logger, silentLogger } from '../logger.js';
import { permsFromJson } from './job_records.js';
import { QUEUE_DEFAULTS } from './queue_names.js';
import { CHILD_QUEUE_DEPTHS, queuedRun } from './queued_run.js';

/** What a live job token stands for: its job's workspace and perms. */
export interface SharedJobTokenGrant {
  readonly jobId: string;
  readonly workspace: string;
  readonly perms: JobPerms;
  /**
   * The nesting depth of the queued job the token was issued to (on a worker): its job-token
   * children go to the queue one deeper. Absent for a job that did not come from the queue (a
   * server's own run): its children run on the server that receives them, in process.
   */
  readonly depth?: number;
}

/** The Redis commands the tokens need (ioredis `Redis` or `Cluster`). */
export interface JobTokenRedis {
  set(key: string, value: string, px: 'PX', ms: number): Promise<unknown>;
  get(key: string): Promise<string | null>;
  del(key: string): Promise<number>;
}

export interface RawSharedJobTokensOptions {
  /** The Redis the servers queue on (ioredis `Redis` or `Cluster`; used as given). */
  redis: JobTokenRedis;
  /** @default '{viewer-cache}' (the queue's prefix) */
  prefix?: string;
  /** Longest a token lives if its job never ends (a worker killed mid-job). @default 60 s + 30 s */
  maxLifeMs?: number;
  /** @default silent */
  logger?: Logger;
}

const PREFIX = 'vcjob_';

/** Longest a token command may take: a Redis that is away fails the job, it does not hang it. */
const COMMAND_TIMEOUT_MS = 2000;

/**
 * Job tokens shared by every server and worker of a deployment (child jobs, flow steps): a
 * random token; under a hash of it, Redis keeps its job's grant while the job runs — sealed with
 * a key derived from the token itself, so Redis holds nothing readable and nothing a Redis
 * writer could mint a token from — and it is deleted when the job ends, so any server accepts
 * the token while the job runs and none does once it has ended. A worker killed mid-job leaves a
 * token that still dies at `maxLifeMs` (the key's expiry). One Redis command to issue, one to
 * revoke, one to verify.
 */
export class SharedJobTokens implements JobTokenIssuer {
  readonly #redis: JobTokenRedis;
  readonly #prefix: string;
  readonly #maxLifeMs: number;
  readonly #logger: Logger;
  readonly #byJob = new Map<string, string>();

  constructor(options: RawSharedJobTokensOptions) {
    const redis = options?.redis;
    if (typeof redis?.set !== 'function' || typeof redis.get !== 'function')
      throw new TypeError('redis must be an ioredis Redis or Cluster client');
    this.#redis = redis;
    this.#prefix = options.prefix ?? QUEUE_DEFAULTS.prefix;
    if (typeof this.#prefix !== 'string' || this.#prefix.length === 0)
      throw new TypeError('prefix must be a non-empty string');
    this.#maxLifeMs = options.maxLifeMs ?? 90_000;
    if (!Number.isInteger(this.#maxLifeMs) || this.#maxLifeMs <= 0)
      throw new TypeError('maxLifeMs must be a positive integer of milliseconds');
    this.#logger = options.logger ?? silentLogger;
  }

  /** Stored before the job's code runs: the token works from its first use. */
  async issue(job: Job): Promise<string> {
    const secret = randomBytes(32);
    const token = PREFIX + secret.toString('base64url');
    const key = this.#keyOf(token);
    // Issued inside a queued job (a worker): the job's depth, from the queue it was taken from.
    const depth = queuedRun()?.depth;
    const fields = [job.id, job.workspace, JSON.stringify(job.perms)];
    const grant = JSON.stringify(depth === undefined ? fields : [...fields, depth]);
    await bounded(this.#redis.set(key, seal(token, key, grant), 'PX', this.#maxLifeMs));
    this.#byJob.set(job.id, key);
    return token;
  }

  /** Deleted when the job ends, before its result is handed back. */
  async revoke(job: Job): Promise<void> {
    const key = this.#byJob.get(job.id);
    if (key === undefined) return;
    this.#byJob.delete(job.id);
    try {
      await bounded(this.#redis.del(key));
    } catch (err) {
      // The token still dies at its expiry; the job's own outcome is not changed by this.
      this.#logger.warn({ code: (err as { code?: unknown }).code }, 'job token not deleted');
    }
  }

  /** The grant of a live token, or null (unknown, ended, expired, malformed). */
  async verify(token: string): Promise<SharedJobTokenGrant | null> {
    if (typeof token !== 'string' || !token.startsWith(PREFIX) || token.length > 100) return null;
    const key = this.#keyOf(token);
    const sealed = await bounded(this.#redis.get(key));
    if (sealed === null) return null;
    const text = open(token, key, sealed);
    if (text === null) return null;
    const [jobId, workspace, perms, depth] = JSON.parse(text) as [string, string, string, unknown?];
    const grant = { jobId, workspace, perms: permsFromJson(perms) };
    if (depth === undefined) return grant;
    if (!Number.isInteger(depth) || (depth as number) < 0 || (depth as number) > CHILD_QUEUE_DEPTHS)
      return null;
    return { ...grant, depth: depth as number };
  }

  /** The key a token's grant lives under (in the queue's hash tag: one slot on a Cluster). */
  #keyOf(token: string): string {
    const digest = createHash('sha256').update(`job token v1:${token}`).digest('base64url');
    return `${this.#prefix}:jobtoken:${digest}`;
  }
}

/** AES-256-GCM under a key only the token's holder can derive, bound to the key name. */
function seal(token: string, key: string, text: string): string {
  const iv = randomBytes(12);
  const cipher = createCipheriv('aes-256-gcm', grantKey(token), iv);
  cipher.setAAD(Buffer.from(key));
  const body = Buffer.concat([cipher.update(text, 'utf8'), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64');
}

function open(token: string, key: string, sealed: string): string | null {
  const raw = Buffer.from(sealed, 'base64');
  if (raw.length < 28) return null;
  try {
    const decipher = createDecipheriv('aes-256-gcm', grantKey(token), raw.subarray(0, 12));
    decipher.setAAD(Buffer.from(key));
    decipher.setAuthTag(raw.subarray(12, 28));
    return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString('utf8');
  } catch {
    return null;
  }
}

function grantKey(token: string): Buffer {
  return Buffer.from(hkdfSync('sha256', token, 'viewer-cache job token', 'grant v1', 32));
}

/** A Redis command that fails with E_QUEUE_UNAVAILABLE rather than waiting for Redis forever. */
async function bounded<T>(command: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      command,
      new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new QueueUnavailableError('job tokens: Redis did not answer')),
          COMMAND_TIMEOUT_MS,
        );
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
