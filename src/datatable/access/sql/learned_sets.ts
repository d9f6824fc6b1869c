/** Learned dependency sets (learned_sets.ts): one statement each. */
import { LEARNED_CHANNEL } from '../../catalog/migrations.js';

export const READ_LEARNED = `
  select everything, members, mac from viewer_cache.learned_set
   where workspace = $1 and path = $2 and hash = $3`;

/** A load: the set, and whether its last use is old enough to be recorded again. */
export const LOAD_LEARNED = `
  select everything, members, mac, used_at < now() - interval '1 hour' as stale
    from viewer_cache.learned_set
   where workspace = $1 and path = $2 and hash = $3`;

/** Records a use (at most hourly per version, from LOAD_LEARNED's `stale`). */
export const TOUCH_LEARNED = `
  update viewer_cache.learned_set set used_at = now()
   where workspace = $1 and path = $2 and hash = $3`;

/**
 * One bounded batch of sets unused for `$1` seconds; the removed rows' count. The rows are
 * skipped when a save holds them (SKIP LOCKED): a set growing now is in use.
 */
export const COLLECT_LEARNED = `
  delete from viewer_cache.learned_set
   where ctid in (select ctid from viewer_cache.learned_set
                   where used_at < now() - make_interval(secs => $1)
                   limit $2 for update skip locked)`;

/** The first set of a version; no row (rowCount 0) when one is there already. */
export const INSERT_LEARNED_IF_ABSENT = `
  insert into viewer_cache.learned_set (workspace, path, hash, everything, members, mac)
  values ($1, $2, $3, $4, $5, $6)
  on conflict (workspace, path, hash) do nothing`;

/** Locked for the union: two processes growing one set at once take turns, neither loses. */
export const LOCK_LEARNED = `${READ_LEARNED} for update`;

export const UPDATE_LEARNED = `
  update viewer_cache.learned_set set everything = $4, members = $5, mac = $6, updated_at = now(),
         used_at = now()
   where workspace = $1 and path = $2 and hash = $3`;

/** Announces a set that changed, by its digest (no names on the channel). */
export const NOTIFY_LEARNED = `select pg_notify('${LEARNED_CHANNEL}', $1)`;
