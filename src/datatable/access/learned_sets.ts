import { createHash, createHmac, timingSafeEqual } from 'node:crypto';
import type pg from 'pg';
import type { Logger } from '../../logger.js';
import { withPooledClient } from '../../pg/pg_clients.js';
import { withTransaction } from '../../pg/transaction.js';
import type { DependencySet } from './dependency.js';
import * as sql from './sql/learned_sets.js';

/** A runnable version: what a learned set belongs to. */
export interface RunnableVersion {
  readonly workspace: string;
  readonly path: string;
  readonly hash: string;
}

/**
 * Learned dependency sets shared by every process, in the catalog database (SPEC invariants 10
 * and 17). Each process used to learn on its own what a runnable version asks, so
 * a second viewer's entry written by one process was under a fingerprint another process, not
 * having learned it, did not compute: a miss per (process, version), after every deploy and
 * restart. Shared, every process computes the same fingerprint from its first request.
 *
 * Integrity over secrecy: a set that omits a question would make the fingerprint blind to its
 * answer, so each row carries an HMAC (under a key derived from the deployment's `secretKey`)
 * over its canonical text, and a row that does not verify — forged, truncated, edited by hand,
 * another deployment's — is treated as *not learned*: the full fingerprint, which needs no
 * trust. Nothing here is sensitive (data-table and role names, never viewers), so no secrecy.
 *
 * Growth is a union under a row lock: two processes growing one set at once take turns and the
 * row ends holding both, so a set converges; each change is announced on
 * `viewer_cache_learned` with the version's digest and the set's size, and every process holding
 * a set of another size drops its copy and reads the row again on its next run of that version.
 */
export class LearnedSets {
  readonly #pool: pg.Pool;
  readonly #key: Uint8Array;
  readonly #logger: Logger;

  constructor(options: { pool: pg.Pool; key: Uint8Array; logger: Logger }) {
    this.#pool = options.pool;
    this.#key = options.key;
    this.#logger = options.logger;
  }

  /** The version's name on the channel (no names travel there). */
  static digest(version: RunnableVersion): string {
    return createHash('sha256')
      .update(canonical(version, false, []))
      .digest('base64url');
  }

  /**
   * An announcement's version digest and set size (-1: everything), or null for a payload that
   * is not one. Anyone may NOTIFY: an announcement only makes a process read the row again.
   */
  static parseAnnouncement(payload: string): { digest: string; size: number } | null {
    const match = /^([A-Za-z0-9_-]{43}) (-1|\d{1,9})$/.exec(payload);
    return match === null ? null : { digest: match[1] as string, size: Number(match[2]) };
  }

  /**
   * The stored set of `version`, or null when none is stored or it does not verify. Records the
   * use (at most hourly per version), so the set is not collected while it is read.
   */
  async load(version: RunnableVersion): Promise<DependencySet | null> {
    const ids = [version.workspace, version.path, version.hash];
    const { rows } = await this.#pool.query<Row & { stale: boolean }>(sql.LOAD_LEARNED, ids);
    const set = this.#verified(version, rows[0]);
    if (set !== null && rows[0]?.stale === true) await this.#pool.query(sql.TOUCH_LEARNED, ids);
    return set;
  }

  /**
   * Removes the sets of versions no process has read or grown for `idleMs` (their runnable
   * versions are no longer served, or only by processes that read them long ago), in batches
   * of {@link COLLECT_BATCH}, at most `maxRows` in one call. Always safe: a version without a set
   * is keyed on the full fingerprint until its runs learn it again, and a process still holding
   * a collected set keeps computing the same fingerprint over it.
   *
   * @returns how many sets were removed
   */
  async collect(idleMs: number, maxRows: number): Promise<number> {
    let removed = 0;
    while (removed < maxRows) {
      const batch = Math.min(COLLECT_BATCH, maxRows - removed);
      const { rowCount } = await this.#pool.query(sql.COLLECT_LEARNED, [idleMs / 1000, batch]);
      removed += rowCount ?? 0;
      if ((rowCount ?? 0) < batch) break;
    }
    if (removed > 0) this.#logger.info({ removed }, 'collected unused learned dependency sets');
    return removed;
  }

  /**
   * Stores the union of `set` and what is stored (a row that does not verify counts as
   * nothing), announces it when it changed, and returns the stored set.
   */
  save(version: RunnableVersion, set: DependencySet): Promise<DependencySet> {
    return withPooledClient(this.#pool, async (client) => {
      const ids = [version.workspace, version.path, version.hash];
      return withTransaction(client, async () => {
        const inserted = await client.query(sql.INSERT_LEARNED_IF_ABSENT, [
          ...ids,
          set.everything,
          set.members,
          this.#mac(version, set),
        ]);
        let merged = set;
        if (inserted.rowCount !== 1) {
          const { rows } = await client.query<Row>(sql.LOCK_LEARNED, ids);
          const stored = this.#verified(version, rows[0]);
          merged = stored === null ? set : union(stored, set);
          if (merged === stored) return stored;
          await client.query(sql.UPDATE_LEARNED, [
            ...ids,
            merged.everything,
            merged.members,
            this.#mac(version, merged),
          ]);
        }
        await client.query(sql.NOTIFY_LEARNED, [
          `${LearnedSets.digest(version)} ${merged.everything ? -1 : merged.members.length}`,
        ]);
        return merged;
      });
    });
  }

  #verified(version: RunnableVersion, row: Row | undefined): DependencySet | null {
    if (row === undefined) return null;
    const members = Array.isArray(row.members) ? row.members : [];
    const set: DependencySet = Object.freeze({
      everything: row.everything === true,
      members: Object.freeze([...members]),
    });
    const expected = this.#mac(version, set);
    const mac = Buffer.isBuffer(row.mac) ? row.mac : Buffer.alloc(0);
    if (
      mac.length !== expected.length ||
      !timingSafeEqual(mac, expected) ||
      !isSortedDistinct(set.members)
    ) {
      this.#logger.warn(
        { digest: LearnedSets.digest(version) },
        'a learned dependency set does not verify: treated as not learned (full fingerprint)',
      );
      return null;
    }
    return set;
  }

  #mac(version: RunnableVersion, set: DependencySet): Buffer {
    return createHmac('sha256', this.#key)
      .update(canonical(version, set.everything, set.members))
      .digest();
  }
}

/** Rows removed per statement by {@link LearnedSets.collect}: short locks, short transactions. */
export const COLLECT_BATCH = 1000;

interface Row {
  everything: boolean;
  members: string[];
  mac: Buffer;
}

/** JSON of a fixed-shape array: no two (version, set) pairs share a text. */
function canonical(
  version: RunnableVersion,
  everything: boolean,
  members: readonly string[],
): string {
  return JSON.stringify([
    'viewer-cache learned set v1',
    version.workspace,
    version.path,
    version.hash,
    everything,
    members,
  ]);
}

function isSortedDistinct(members: readonly string[]): boolean {
  for (let i = 1; i < members.length; i++) {
    if (!((members[i - 1] as string) < (members[i] as string))) return false;
  }
  return true;
}

/** `a` itself when `b` adds nothing to it. */
function union(a: DependencySet, b: DependencySet): DependencySet {
  if (a.everything) return a;
  if (b.everything) return b;
  const members = new Set([...a.members, ...b.members]);
  if (members.size === a.members.length) return a;
  return Object.freeze({ everything: false, members: Object.freeze([...members].sort()) });
}
