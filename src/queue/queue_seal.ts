import { createCipheriv, createDecipheriv, createHmac, hkdfSync } from 'node:crypto';
import { newNonce } from '../util/nonces.js';

/**
 * The queue's keys, derived from the deployment's secret (VIEWER_CACHE_SECRET_KEY) with HKDF, one
 * per purpose, so a seal of one kind can never stand for another: job records, queue ids,
 * results. Servers and workers derive the same keys from the same secret; a Redis writer
 * has none of them.
 */
export class QueueKeys {
  readonly #record: Buffer;
  readonly #id: Buffer;
  readonly #result: Buffer;

  constructor(secretKey: string) {
    if (typeof secretKey !== 'string' || secretKey.length < 16) {
      throw new TypeError('secretKey must be the deployment secret (at least 16 characters)');
    }
    const derive = (info: string) =>
      Buffer.from(hkdfSync('sha256', secretKey, 'viewer-cache queue', info, 32));
    this.#record = derive('job record v1');
    this.#id = derive('queue id v1');
    this.#result = derive('result v1');
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
    return seal(this.#result, `result:${queueId}`, json);
  }

  /** The answer's JSON bytes, or null when it does not open under this queue id. */
  openResult(queueId: string, sealed: unknown): Buffer | null {
    return open(this.#result, `result:${queueId}`, sealed);
  }

  /** Seals a job record (the server's, at run start) to `bound`: what the message names. */
  sealRecord(bound: string, text: string): string {
    return seal(this.#record, bound, Buffer.from(text, 'utf8'));
  }

  /** The record's text, or null when it does not open under exactly `bound`. */
  openRecord(bound: string, sealed: unknown): string | null {
    return open(this.#record, bound, sealed)?.toString('utf8') ?? null;
  }
}

/** AES-256-GCM: iv (12) ‖ tag (16) ‖ body, base64; `aad` binds it to what it belongs to. */
function seal(key: Buffer, aad: string, plain: Uint8Array): string {
  const iv = newNonce(12);
  const cipher = createCipheriv('aes-256-gcm', key, iv);
  cipher.setAAD(Buffer.from(aad));
  const body = Buffer.concat([cipher.update(plain), cipher.final()]);
  return Buffer.concat([iv, cipher.getAuthTag(), body]).toString('base64');
}

function open(key: Buffer, aad: string, sealed: unknown): Buffer | null {
  if (typeof sealed !== 'string') return null;
  const raw = Buffer.from(sealed, 'base64');
  if (raw.length < 28) return null;
  try {
    const decipher = createDecipheriv('aes-256-gcm', key, raw.subarray(0, 12));
    decipher.setAAD(Buffer.from(aad));
    decipher.setAuthTag(raw.subarray(12, 28));
    return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]);
  } catch {
    return null;
  }
}
