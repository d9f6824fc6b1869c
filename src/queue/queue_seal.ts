import {
  createCipheriv,
  createDecipheriv,
  createHmac,
  hkdfSync,
  randomBytes,
  timingSafeEqual,
} from 'node:crypto';

/**
 * The queue's keys, derived from the deployment's secret (VIEWER_CACHE_SECRET_KEY) with HKDF, one
 * per purpose, so a MAC of one kind can never stand for another: messages, queue ids, results.
 * Servers and workers derive the same keys from the same secret; a Redis writer has none of them.
 */
export class QueueKeys {
  readonly #message: Buffer;
  readonly #id: Buffer;
  readonly #result: Buffer;

  constructor(secretKey: string) {
    if (typeof secretKey !== 'string' || secretKey.length < 16) {
      throw new TypeError('secretKey must be the deployment secret (at least 16 characters)');
    }
    const derive = (info: string) =>
      Buffer.from(hkdfSync('sha256', secretKey, 'viewer-cache queue', info, 32));
    this.#message = derive('message v1');
    this.#id = derive('queue id v1');
    this.#result = derive('result v1');
  }

  /** The MAC a queue message carries: over its workspace, job record id and queue id. */
  mac(message: { workspace: string; jobId: string; queueId: string }): string {
    return createHmac('sha256', this.#message)
      .update(JSON.stringify(['job', message.workspace, message.jobId, message.queueId]))
      .digest('base64url');
  }

  verify(message: { workspace: string; jobId: string; queueId: string; mac: string }): boolean {
    if (typeof message.mac !== 'string') return false;
    const expected = Buffer.from(this.mac(message));
    const given = Buffer.from(message.mac);
    return given.length === expected.length && timingSafeEqual(given, expected);
  }

  /**
   * The BullMQ job id of a run: a keyed hash of what identifies it — the full cache key for a
   * cached run (identical misses in flight become one queued job, on any server), the job id
   * otherwise. Nothing in it can be turned back into the key, the viewer or the args.
   */
  queueId(flight: string): string {
    return createHmac('sha256', this.#id).update(flight).digest('base64url');
  }

  /** Seals a worker's answer to the queue id it answers: it opens for that run and no other. */
  sealResult(queueId: string, json: Uint8Array): string {
    const iv = randomBytes(12);
    const cipher = createCipheriv('aes-256-gcm', this.#result, iv);
    cipher.setAAD(Buffer.from(`result:${queueId}`));
    const body = Buffer.concat([cipher.update(json), cipher.final()]);
    return Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64');
  }

  /** The answer's JSON bytes, or null when it does not open under this queue id. */
  openResult(queueId: string, sealed: unknown): Buffer | null {
    if (typeof sealed !== 'string') return null;
    const raw = Buffer.from(sealed, 'base64');
    if (raw.length < 28) return null;
    try {
      const decipher = createDecipheriv('aes-256-gcm', this.#result, raw.subarray(0, 12));
      decipher.setAAD(Buffer.from(`result:${queueId}`));
      decipher.setAuthTag(raw.subarray(12, 28));
      return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]);
    } catch {
      return null;
    }
  }
}
