/** Learned dependency sets (learned_sets.ts): one statement each. */
import { LEARNED_CHANNEL } from '../../catalog/migrations.js';

export const READ_LEARNED = `
  select everything, members, mac from viewer_cache.learned_set
   where workspace = $1 and path = $2 and hash = $3`;

/** The first set of a version; no row (rowCount 0) when one is there already. */
export const INSERT_LEARNED_IF_ABSENT = `
  insert into viewer_cache.learned_set (workspace, path, hash, everything, members, mac)
  values ($1, $2, $3, $4, $5, $6)
  on conflict (workspace, path, hash) do nothing`;

/** Locked for the union: two processes growing one set at once take turns, neither loses. */
export const LOCK_LEARNED = `${READ_LEARNED} for update`;

export const UPDATE_LEARNED = `
  update viewer_cache.learned_set set everything = $4, members = $5, mac = $6, updated_at = now()
   where workspace = $1 and path = $2 and hash = $3`;

/** Announces a set that changed, by its digest (no names on the channel). */
export const NOTIFY_LEARNED = `select pg_notify('${LEARNED_CHANNEL}', $1)`;
