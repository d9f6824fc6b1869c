import { createCipheriv, createDecipheriv, createHash, hkdfSync } from 'node:crypto';
import { QueueUnavailableError } from '../errors.js';
import type { JobTokenIssuer } from '../executor/executor.js';
import type { Job, JobPerms } from '../job.js';
import { type Logger, silentLogger } from '../logger.js';
import { newNonce } from '../util/nonces.js';
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
}

export interface RawSharedJobTokensOptions {
  /** The Redis the servers queue on (ioredis `Redis` or `Cluster`; used as given). */
  redis: JobTokenRedis;
  /**
   * The deployment secret (VIEWER_CACHE_SECRET_KEY), the same on every server and worker: a
   * token's grant is sealed under a key derived from it, so only a server or worker can make one.
   */
  secretKey: string;
  /** @default '{viewer-cache}' (the queue's prefix) */
  prefix?: string;
  /** Longest a token lives if its job never ends (a worker killed mid-job). @default 60 s + 30 s */
  maxLifeMs?: number;
  /** @default silent */
  logger?: Logger;
}

const PREFIX = 'vcjob_';

/** Longest token accepted: a grant with a long embed identity still fits (header limits: 16 KiB). */
const MAX_TOKEN_CHARS = 8192;

/** Longest a token command may take: a Redis that is away fails the job, it does not hang it. */
const COMMAND_TIMEOUT_MS = 2000;

/**
 * Job tokens shared by every server and worker of a deployment (child jobs, flow steps). A token
 * *is* its grant — job id, workspace, perms and expiry, sealed (AES-256-GCM) under a key derived
 * from the deployment secret and bound to the queue's prefix — so any server accepts it from
 * its first use without a lookup of what it stands for, and nobody without the secret can make
 * one (not even a Redis writer). When the job ends, `revoke` marks it ended in Redis (under a
 * SHA-256 of the token) until its expiry, and no server accepts it after; a worker killed
 * mid-job leaves a token that still dies at `maxLifeMs`.
 *
 * Issued lazily ({@link JobTokenIssuer.lazy}): a runnable that never reads `ctx.jobToken` costs
 * no Redis command at all; one that reads it costs one command when its job ends, and each
 * verification one GET.
 */
export class SharedJobTokens implements JobTokenIssuer {
  /** `issue` answers at once: the executor issues on the runnable's first read of the token. */
  readonly lazy = true;
  readonly #redis: JobTokenRedis;
  readonly #prefix: string;
  readonly #maxLifeMs: number;
  readonly #logger: Logger;
  readonly #key: Buffer;
  readonly #aad: Buffer;
  /** Issued tokens of running jobs: the key their end is marked under, and their expiry. */
  readonly #byJob = new Map<string, { key: string; expiresAt: number }>();

  constructor(options: RawSharedJobTokensOptions) {
    const redis = options?.redis;
    if (typeof redis?.set !== 'function' || typeof redis.get !== 'function')
      throw new TypeError('redis must be an ioredis Redis or Cluster client');
    const secretKey = options.secretKey;
    if (typeof secretKey !== 'string' || secretKey.length < 16)
      throw new TypeError('secretKey must be the deployment secret (at least 16 characters)');
    this.#redis = redis;
    this.#prefix = options.prefix ?? QUEUE_DEFAULTS.prefix;
    if (typeof this.#prefix !== 'string' || this.#prefix.length === 0)
      throw new TypeError('prefix must be a non-empty string');
    this.#maxLifeMs = options.maxLifeMs ?? 90_000;
    if (!Number.isInteger(this.#maxLifeMs) || this.#maxLifeMs <= 0)
      throw new TypeError('maxLifeMs must be a positive integer of milliseconds');
    this.#logger = options.logger ?? silentLogger;
    this.#key = Buffer.from(
      hkdfSync('sha256', secretKey, 'viewer-cache job token', 'grant v2', 32),
    );
    this.#aad = Buffer.from(JSON.stringify(['job token v2', this.#prefix]));
  }

  /** The job's token, valid from now until it is revoked or expires. No I/O. */
  issue(job: Job): string {
    const expiresAt = Date.now() + this.#maxLifeMs;
    // Issued inside a queued job (a worker): the job's depth, from the queue it was taken from.
    const depth = queuedRun()?.depth;
    const fields = [job.id, job.workspace, JSON.stringify(job.perms), expiresAt];
    const grant = JSON.stringify(depth === undefined ? fields : [...fields, depth]);
    const iv = newNonce(12);
    const cipher = createCipheriv('aes-256-gcm', this.#key, iv);
    cipher.setAAD(this.#aad);
    const body = Buffer.concat([cipher.update(grant, 'utf8'), cipher.final()]);
    const token = PREFIX + Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64url');
    this.#byJob.set(job.id, { key: this.#keyOf(token), expiresAt });
    return token;
  }

  /** Marks the job's token ended (when one was issued), before its result is handed back. */
  async revoke(job: Job): Promise<void> {
    const issued = this.#byJob.get(job.id);
    if (issued === undefined) return;
    this.#byJob.delete(job.id);
    // Kept until the token would have expired anyway (and a little beyond: clocks differ).
    const ms = Math.max(1, issued.expiresAt - Date.now()) + ENDED_MARGIN_MS;
    try {
      await bounded(this.#redis.set(issued.key, 'ended', 'PX', ms));
    } catch (err) {
      // The token still dies at its expiry; the job's own outcome is not changed by this.
      this.#logger.warn({ code: (err as { code?: unknown }).code }, 'job token not revoked');
    }
  }

  /** The grant of a live token, or null (forged, another deployment's, ended, expired). */
  async verify(token: string): Promise<SharedJobTokenGrant | null> {
    if (typeof token !== 'string' || !token.startsWith(PREFIX) || token.length > MAX_TOKEN_CHARS)
      return null;
    const text = this.#open(token.slice(PREFIX.length));
    if (text === null) return null;
    const [jobId, workspace, perms, expiresAt, depth] = JSON.parse(text) as [
      string,
      string,
      string,
      number,
      unknown?,
    ];
    if (!(expiresAt > Date.now())) return null;
    if (depth !== undefined) {
      if (
        !Number.isInteger(depth) ||
        (depth as number) < 0 ||
        (depth as number) > CHILD_QUEUE_DEPTHS
      )
        return null;
    }
    if ((await bounded(this.#redis.get(this.#keyOf(token)))) !== null) return null;
    const grant = { jobId, workspace, perms: permsFromJson(perms) };
    return depth === undefined ? grant : { ...grant, depth: depth as number };
  }

  #open(sealed: string): string | null {
    const raw = Buffer.from(sealed, 'base64url');
    if (raw.length < 28) return null;
    try {
      const decipher = createDecipheriv('aes-256-gcm', this.#key, raw.subarray(0, 12));
      decipher.setAAD(this.#aad);
      decipher.setAuthTag(raw.subarray(12, 28));
      return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString('utf8');
    } catch {
      return null;
    }
  }

  /** The key a token's end is marked under (in the queue's hash tag: one slot on a Cluster). */
  #keyOf(token: string): string {
    const digest = createHash('sha256').update(`job token v2:${token}`).digest('base64url');
    return `${this.#prefix}:jobtoken:${digest}`;
  }
}

/** How long an ended mark outlives its token's expiry (a verifier whose clock lags). */
const ENDED_MARGIN_MS = 60_000;

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
