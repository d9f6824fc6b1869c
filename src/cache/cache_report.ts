import {
  type BypassReason,
  type NotStoredReason,
  type RejectionReason,
  type ResultCacheEvents,
  TypedEmitter,
} from '../events.js';
import type { Job } from '../job.js';

/** Counters since construction. Reading them costs nothing on the hot path. */
export interface ResultCacheStats {
  hits: number;
  misses: number;
  coalesced: number;
  bypasses: number;
  stored: number;
  notStored: number;
  /** Entries read but refused: corrupt, not opening under their key, or expired. */
  rejected: number;
  storeErrors: number;
}

/**
 * What the result cache tells the outside: its counters and its events, one method per outcome.
 * Payloads are built only when someone listens, and never carry a key, a viewer or args.
 */
export class CacheReport {
  readonly stats: ResultCacheStats = {
    hits: 0,
    misses: 0,
    coalesced: 0,
    bypasses: 0,
    stored: 0,
    notStored: 0,
    rejected: 0,
    storeErrors: 0,
  };
  readonly events = new TypedEmitter<ResultCacheEvents>();

  hit(job: Job): void {
    this.stats.hits++;
    if (this.events.has('cache:hit')) this.events.emit('cache:hit', where(job));
  }

  miss(job: Job): void {
    this.stats.misses++;
    if (this.events.has('cache:miss')) this.events.emit('cache:miss', where(job));
  }

  coalesced(job: Job): void {
    this.stats.coalesced++;
    if (this.events.has('cache:coalesced')) this.events.emit('cache:coalesced', where(job));
  }

  bypass(job: Job, reason: BypassReason): void {
    this.stats.bypasses++;
    if (this.events.has('cache:bypass')) {
      this.events.emit('cache:bypass', { ...where(job), reason });
    }
  }

  rejected(job: Job, reason: RejectionReason): void {
    this.stats.rejected++;
    if (this.events.has('cache:rejected')) {
      this.events.emit('cache:rejected', { ...where(job), reason });
    }
  }

  stored(job: Job, bytes: number): void {
    this.stats.stored++;
    if (this.events.has('cache:stored')) this.events.emit('cache:stored', { ...where(job), bytes });
  }

  notStored(job: Job, reason: NotStoredReason): void {
    this.stats.notStored++;
    if (this.events.has('cache:not-stored')) {
      this.events.emit('cache:not-stored', { ...where(job), reason });
    }
  }

  storeError(op: 'get' | 'set', code: string, message: string): void {
    this.stats.storeErrors++;
    if (this.events.has('store:error')) this.events.emit('store:error', { op, code, message });
  }
}

function where(job: Job): { workspace: string; path: string } {
  return { workspace: job.workspace, path: job.runnable.path };
}
