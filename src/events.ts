import { EventEmitter } from 'node:events';

/**
 * Typed events. Payloads never hold a viewer email, args, a cache key or a value: listeners
 * commonly forward them to logs and metrics.
 */
export interface ResultCacheEvents {
  /** Served from the store without executing. */
  'cache:hit': { workspace: string; path: string };
  /** Not in the store: this call executes. */
  'cache:miss': { workspace: string; path: string };
  /** Joined an identical in-flight run of the same viewer instead of executing. */
  'cache:coalesced': { workspace: string; path: string };
  /** The cache was not consulted: no TTL, the store is resting after a failure, or the fingerprint failed. */
  'cache:bypass': { workspace: string; path: string; reason: BypassReason };
  /** A successful result was written to the store. */
  'cache:stored': { workspace: string; path: string; bytes: number };
  /** A successful result was not written. */
  'cache:not-stored': { workspace: string; path: string; reason: NotStoredReason };
  /** A stored entry was read but refused (and treated as a miss). */
  'cache:rejected': {
    workspace: string;
    path: string;
    reason: RejectionReason;
  };
  /** The store failed or timed out; the run went on uncached. */
  'store:error': { op: 'get' | 'set'; code: string; message: string };
}

/**
 * Why a stored entry was refused: not an envelope; an unsealed entry of another key; a sealed
 * entry that does not open under this key and secret (tampered, truncated, forged, moved, or
 * another deployment's); past its expiry.
 */
export type RejectionReason = 'corrupt' | 'foreign-key' | 'unauthentic' | 'expired';
export type BypassReason = 'no-ttl' | 'store-resting' | 'fingerprint-failed' | 'store-not-ready';
export type NotStoredReason = 'fingerprint-moved' | 'unserializable' | 'too-large' | 'store-failed';

/** Event emitter with the map above; `has` lets hot paths skip building payloads. */
export class TypedEmitter<Events extends object> {
  readonly #emitter = new EventEmitter();

  on<E extends keyof Events & string>(event: E, listener: (payload: Events[E]) => void): this {
    this.#emitter.on(event, listener);
    return this;
  }

  off<E extends keyof Events & string>(event: E, listener: (payload: Events[E]) => void): this {
    this.#emitter.off(event, listener);
    return this;
  }

  has(event: keyof Events & string): boolean {
    return this.#emitter.listenerCount(event) > 0;
  }

  /** Calls listeners; one that throws cannot break the run that emitted. */
  emit<E extends keyof Events & string>(event: E, payload: Events[E]): void {
    for (const listener of this.#emitter.listeners(event)) {
      try {
        (listener as (payload: Events[E]) => void)(payload);
      } catch {
        // A faulty listener is the listener's problem; the run goes on.
      }
    }
  }
}
