import { embedViewerOf } from '../embed_viewer.js';
import { canonicalRoleScope, type Job } from '../job.js';
import { canonicalKeyInput, embedViewerJson } from './cache_key.js';

/**
 * Recent runs' keys, found from the job's parts without building its key text. A hit's key is,
 * by definition, one seen before; building the canonical key input (≈ 0.75 µs for ten-field
 * args) and then hashing that fresh text for a map lookup (≈ 1 µs: V8 flattens and hashes all
 * of its characters) was the largest piece of a hit the floor does not pay, and about twice that
 * right after an idle wait for a reply (`bench/redis_split.ts`). Here a lookup reads short
 * strings V8 has usually hashed already (the runnable's path, the viewer) and compares the args
 * with a copy taken when the entry was made: no string built, nothing hashed but the path.
 *
 * **What a hit promises:** the job's key input equals, character for character, the input the
 * entry's value was made for. Every part is compared with `===` to the part of an input that was
 * encoded and checked (so a hit needs no check of its own), and the args with {@link sameArgs},
 * whose equality implies equal canonical JSON. The copy is made from the args after they were
 * encoded, then encoded itself: if its text is not the input's (args whose getters answer
 * differently each time), nothing is kept. Anything the encoder refuses (holes, `undefined`,
 * symbol keys, non-plain objects, non-finite numbers, cycles) never equals a copy, so such a job
 * misses here and is refused by the encoder as before.
 *
 * Bounded as `RecentMemo` is: two generations of at most `perGeneration` entries, each
 * generation dropped whole; a (path, viewer) pair keeps at most {@link BUCKET} entries. Args
 * whose key input is longer than {@link MAX_INPUT} characters are not kept (the caller's memo of
 * key texts still serves them).
 */
export class KeyPartsMemo<V> {
  readonly #perGeneration: number;
  #current: Generation<V> = new Map();
  #previous: Generation<V> = new Map();
  #count = 0;

  constructor(perGeneration: number) {
    if (!Number.isInteger(perGeneration) || perGeneration < 1) {
      throw new RangeError('perGeneration must be a positive integer');
    }
    this.#perGeneration = perGeneration;
  }

  /**
   * The value kept for the key input of `job` with `fingerprint`, if any. Throws only what reading
   * the job's args throws (a getter's own error), as encoding them would.
   */
  get(job: Job, fingerprint: string | null): V | undefined {
    const parts = partsOf(job, fingerprint);
    if (parts === undefined) return undefined;
    const found = find(this.#current, job, parts);
    if (found !== undefined) return found.value;
    const old = find(this.#previous, job, parts);
    if (old === undefined) return undefined;
    this.#keep(parts, old);
    return old.value;
  }

  /**
   * Keeps `value` for `job`'s parts; `input` is `canonicalKeyInput(job, fingerprint)`, already
   * built by the caller. Does nothing for a job it cannot keep exactly. `evict`: whether a full
   * (path, viewer) bucket drops its oldest entry for this one; without it, a viewer cycling
   * through more args than a bucket holds keeps the first ones here (the others are still
   * served by the caller's memo of key texts) rather than copying args on every hit.
   */
  set(job: Job, fingerprint: string | null, input: string, value: V, evict: boolean): void {
    if (input.length > MAX_INPUT) return;
    const parts = partsOf(job, fingerprint);
    if (parts === undefined) return;
    if (!evict && (this.#bucket(parts)?.length ?? 0) >= BUCKET) return;
    const args = snapshot(job.args, 0);
    if (!(args instanceof SnapObject)) return;
    // The copy's own key input must be the input's: only then does a job equal to the copy have
    // this input (and this value).
    const copy: Job = {
      id: '',
      workspace: job.workspace,
      runnable: job.runnable,
      args: plain(args) as Record<string, unknown>,
      perms: job.perms,
    };
    let same: boolean;
    try {
      same = canonicalKeyInput(copy, fingerprint) === input;
    } catch {
      same = false;
    }
    if (!same) return;
    this.#keep(parts, {
      embed: parts.embed,
      workspace: job.workspace,
      hash: job.runnable.hash,
      fingerprint: parts.fingerprint,
      // A copy: the canonical scope may be the job's own array, which its owner may change.
      scope: parts.scope === undefined ? undefined : Object.freeze([...parts.scope]),
      args,
      value,
    });
  }

  /** Entries held, both generations. */
  get size(): number {
    return this.#count + countOf(this.#previous);
  }

  #bucket(parts: Parts): Entry<V>[] | undefined {
    return this.#current.get(parts.path)?.get(parts.viewer);
  }

  #keep(parts: Parts, entry: Entry<V>): void {
    if (this.#count >= this.#perGeneration) {
      this.#previous = this.#current;
      this.#current = new Map();
      this.#count = 0;
    }
    let byViewer = this.#current.get(parts.path);
    if (byViewer === undefined) {
      byViewer = new Map();
      this.#current.set(parts.path, byViewer);
    }
    const bucket = byViewer.get(parts.viewer);
    if (bucket === undefined) {
      byViewer.set(parts.viewer, [entry]);
    } else {
      if (bucket.length >= BUCKET) {
        bucket.pop();
        this.#count--;
      }
      bucket.unshift(entry);
    }
    this.#count++;
  }
}

/** Entries kept per runnable path and viewer (different args or fingerprints), latest first. */
const BUCKET = 8;
/** Longer key inputs are not kept here: their args would cost more to compare and to hold. */
const MAX_INPUT = 2048;

/** path → viewer (email, embed viewer's JSON, or null) → entries. */
type Generation<V> = Map<string, Map<string | null, Entry<V>[]>>;

interface Entry<V> {
  readonly embed: boolean;
  readonly workspace: string;
  readonly hash: string;
  readonly fingerprint: string | null;
  readonly scope: readonly number[] | undefined;
  readonly args: SnapObject;
  readonly value: V;
}

/** The parts of a job a lookup is indexed by, or `undefined` when it cannot be looked up. */
interface Parts {
  readonly path: string;
  /** `undefined` reads as `null`, as in the key input. */
  readonly fingerprint: string | null;
  readonly viewer: string | null;
  readonly embed: boolean;
  readonly scope: readonly number[] | undefined;
}

function partsOf(job: Job, fingerprint: string | null): Parts | undefined {
  // Anything unusual goes the long way, where the encoder checks it and says what is wrong.
  if (fingerprint != null && typeof fingerprint !== 'string') return undefined;
  const { runnable, perms } = job;
  if (typeof runnable?.path !== 'string' || perms === null || typeof perms !== 'object') {
    return undefined;
  }
  let viewer: string | null;
  let embed = false;
  let scope: readonly number[] | undefined;
  try {
    const embedded = embedViewerOf(perms);
    if (embedded !== undefined) {
      viewer = embedViewerJson(embedded);
      embed = true;
    } else {
      const email = perms.endUserEmail;
      if (email !== null && typeof email !== 'string') return undefined;
      viewer = email;
    }
    scope = canonicalRoleScope(perms.roleScope);
  } catch {
    return undefined;
  }
  return { path: runnable.path, fingerprint: fingerprint ?? null, viewer, embed, scope };
}

function find<V>(generation: Generation<V>, job: Job, parts: Parts): Entry<V> | undefined {
  const bucket = generation.get(parts.path)?.get(parts.viewer);
  if (bucket === undefined) return undefined;
  for (let i = 0; i < bucket.length; i++) {
    const entry = bucket[i]!;
    if (
      entry.embed === parts.embed &&
      entry.workspace === job.workspace &&
      entry.hash === job.runnable.hash &&
      entry.fingerprint === parts.fingerprint &&
      sameScope(entry.scope, parts.scope) &&
      sameArgs(job.args, entry.args)
    ) {
      return entry;
    }
  }
  return undefined;
}

function countOf<V>(generation: Generation<V>): number {
  let count = 0;
  for (const byViewer of generation.values()) {
    for (const bucket of byViewer.values()) count += bucket.length;
  }
  return count;
}

/** An object of args as it was encoded: its keys in `Object.keys` order, and their values. */
class SnapObject {
  constructor(
    readonly keys: readonly string[],
    readonly values: readonly Snap[],
  ) {}
}

type Snap = string | number | boolean | null | readonly Snap[] | SnapObject;

/** Deeper copies are not made (the encoder refuses args nested deeper than 64 levels anyway). */
const MAX_DEPTH = 64;

/** A copy of plain JSON data, or `undefined` for anything else. */
function snapshot(value: unknown, depth: number): Snap | undefined {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return value;
    case 'number':
      return Number.isFinite(value) ? value : undefined;
    case 'object': {
      if (value === null) return null;
      if (depth >= MAX_DEPTH) return undefined;
      if (Array.isArray(value)) {
        if (Object.getPrototypeOf(value) !== Array.prototype) return undefined;
        const out: Snap[] = [];
        for (let i = 0; i < value.length; i++) {
          const item = i in value ? snapshot(value[i], depth + 1) : undefined;
          if (item === undefined) return undefined;
          out.push(item);
        }
        return out;
      }
      const proto = Object.getPrototypeOf(value);
      if (proto !== Object.prototype && proto !== null) return undefined;
      if (Object.getOwnPropertySymbols(value).length > 0) return undefined;
      const keys = Object.keys(value);
      const values: Snap[] = [];
      for (const key of keys) {
        const item = snapshot((value as Record<string, unknown>)[key], depth + 1);
        if (item === undefined) return undefined;
        values.push(item);
      }
      return new SnapObject(keys, values);
    }
    default:
      return undefined;
  }
}

/** The plain data a snapshot was taken of (for encoding it once, when it is kept). */
function plain(snap: Snap): unknown {
  if (snap instanceof SnapObject) {
    const out: Record<string, unknown> = {};
    // defineProperty: an own "__proto__" key stays a key (an assignment would set the prototype).
    snap.keys.forEach((key, i) => {
      Object.defineProperty(out, key, {
        value: plain(snap.values[i]!),
        enumerable: true,
        writable: true,
        configurable: true,
      });
    });
    return out;
  }
  if (Array.isArray(snap)) return snap.map(plain);
  return snap;
}

/**
 * Whether `value` is data equal to `snap`: the same primitives (`===`, so `0` and `-0`, which
 * encode alike, are equal), arrays of the same length with equal items, and plain objects with
 * the same keys in the same order, equal values and no symbol keys. Equal data has equal
 * canonical JSON. A snapshot holds no `undefined`, so a hole or an `undefined` never equals it.
 */
function sameArgs(value: unknown, snap: SnapObject): boolean {
  return same(value, snap);
}

function same(value: unknown, snap: Snap): boolean {
  if (typeof snap !== 'object' || snap === null) return value === snap;
  if (typeof value !== 'object' || value === null) return false;
  if (snap instanceof SnapObject) {
    if (Array.isArray(value)) return false;
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) return false;
    const keys = Object.keys(value);
    const expected = snap.keys;
    if (keys.length !== expected.length) return false;
    for (let i = 0; i < keys.length; i++) if (keys[i] !== expected[i]) return false;
    if (Object.getOwnPropertySymbols(value).length > 0) return false;
    const values = snap.values;
    for (let i = 0; i < keys.length; i++) {
      if (!same((value as Record<string, unknown>)[keys[i]!], values[i]!)) return false;
    }
    return true;
  }
  if (!Array.isArray(value) || Object.getPrototypeOf(value) !== Array.prototype) return false;
  if (value.length !== snap.length) return false;
  for (let i = 0; i < snap.length; i++) if (!same(value[i], snap[i]!)) return false;
  return true;
}

function sameScope(a: readonly number[] | undefined, b: readonly number[] | undefined): boolean {
  if (a === b) return true;
  if (a === undefined || b === undefined || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}
