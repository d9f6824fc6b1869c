/**
 * The epoch index: the epochs one process knows (workspace → its epoch and its paths' epochs),
 * the tag a run's key carries, and the hash fields a scope names (`w:<ws>`, `p:<ws>\0<path>`).
 * Pure data; `invalidation_bus.ts` is the state machine that keeps it confirmed from Redis.
 */
import { randomBytes } from 'node:crypto';
import { WORKSPACE_RE } from '../job.js';
import type { InvalidationScope } from './store.js';

/** Epochs as one process knows them: workspace → its epoch and its paths' epochs. */
export class EpochView {
  readonly #workspaces = new Map<string, { epoch: number; paths: Map<string, number> }>();

  constructor(readonly id: string) {}

  static load(hash: Record<string, string>): EpochView {
    const view = new EpochView(hash['_id'] ?? '');
    for (const [field, value] of Object.entries(hash)) {
      if (field !== '_id') view.raise(field, Number(value));
    }
    return view;
  }

  tag(workspace: string, path: string): string {
    const w = this.#workspaces.get(workspace);
    if (w === undefined) return formatTag(this.id, 0, 0);
    return formatTag(this.id, w.epoch, w.paths.get(path) ?? 0);
  }

  epoch(field: string): number {
    const parsed = parseField(field);
    if (parsed === null) return 0;
    const w = this.#workspaces.get(parsed.workspace);
    if (w === undefined) return 0;
    return parsed.path === undefined ? w.epoch : (w.paths.get(parsed.path) ?? 0);
  }

  /** Epochs only move forward: a late or repeated message never lowers one. */
  raise(field: string, epoch: number): void {
    const parsed = parseField(field);
    if (parsed === null || !Number.isSafeInteger(epoch)) return;
    let w = this.#workspaces.get(parsed.workspace);
    if (w === undefined) {
      w = { epoch: 0, paths: new Map() };
      this.#workspaces.set(parsed.workspace, w);
    }
    if (parsed.path === undefined) {
      if (epoch > w.epoch) w.epoch = epoch;
    } else if (epoch > (w.paths.get(parsed.path) ?? 0)) {
      w.paths.set(parsed.path, epoch);
    }
  }
}

/** The text a run's key carries: no ':' inside, so the key input stays unambiguous. */
export function formatTag(id: string, workspaceEpoch: number, pathEpoch: number): string {
  return `${id}.${workspaceEpoch}.${pathEpoch}`;
}

export function parseField(field: string): { workspace: string; path?: string } | null {
  if (field.startsWith('w:')) return { workspace: field.slice(2) };
  if (field.startsWith('p:')) {
    const nul = field.indexOf('\0');
    if (nul < 0) return null;
    return { workspace: field.slice(2, nul), path: field.slice(nul + 1) };
  }
  return null;
}

export function newIncarnation(): string {
  return randomBytes(8).toString('hex');
}

/** The hash field of a scope's epoch; throws a TypeError on a malformed scope. */
export function fieldOf(scope: InvalidationScope): string {
  const { workspace, path } = checkScope(scope);
  return path === undefined ? `w:${workspace}` : `p:${workspace}\0${path}`;
}

function checkScope(scope: InvalidationScope): { workspace: string; path?: string } {
  if (scope === null || typeof scope !== 'object') {
    throw new TypeError('invalidate needs { workspace, path? }');
  }
  const { workspace, path } = scope;
  if (typeof workspace !== 'string' || !WORKSPACE_RE.test(workspace)) {
    throw new TypeError('workspace must be a short identifier ([A-Za-z0-9_.-])');
  }
  if (path === undefined) return { workspace };
  if (typeof path !== 'string' || path.length === 0 || path.includes('\0')) {
    throw new TypeError('path must be a non-empty string without NUL');
  }
  return { workspace, path };
}
