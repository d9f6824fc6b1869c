/** What a job produced. */
export interface JobResult {
  /** The job that asked (on a hit: the current job, not the one that first computed it). */
  readonly jobId: string;
  /**
   * The result value. On a cache hit, and on a miss a queue worker answered, it is parsed from
   * the JSON bytes on first access.
   */
  readonly value: unknown;
  /** True when served from the cache without executing. */
  readonly fromCache: boolean;
  /**
   * True when the executor that computed it already wrote it to the run's cache entry (a queue
   * worker does, after its own fingerprint check): the cache in front does not write it again.
   */
  readonly stored?: boolean;
  /**
   * The result as UTF-8 JSON bytes. On a cache hit these are the stored bytes themselves, so a
   * caller that only forwards JSON never pays a parse or a stringify. Read them, never write
   * into them: on a hit from process memory they are a view of the entry the store holds, and a
   * write would change what every later hit of the same key returns. Copy first
   * (`Buffer.from(result.json())`) to change them.
   */
  json(): Uint8Array;
}

/** A result computed now. The JSON bytes are produced once, on demand. */
export class ComputedResult implements JobResult {
  readonly fromCache = false;
  #json: Uint8Array | undefined;
  /** Made by {@link ComputedResult.received}: its value is parsed from its bytes when read. */
  #received = false;

  constructor(
    readonly jobId: string,
    readonly value: unknown,
    readonly stored = false,
  ) {}

  json(): Uint8Array {
    if (this.#json === undefined) {
      // `undefined` results are sent as JSON null rather than as an empty body.
      this.#json = Buffer.from(JSON.stringify(this.value) ?? 'null');
    }
    return this.#json;
  }

  /** Lets the cache hand over bytes it already serialised for storing. */
  static withJson(jobId: string, value: unknown, json: Uint8Array, stored = false): ComputedResult {
    const result = new ComputedResult(jobId, value, stored);
    result.#json = json;
    return result;
  }

  /**
   * A result computed elsewhere and received as its JSON bytes (a queue worker's answer): its
   * value is parsed from them only if, and when, it is read. A server answering over HTTP
   * forwards the bytes and never parses them.
   */
  static received(jobId: string, json: Uint8Array, stored = false): ComputedResult {
    const result = new ComputedResult(jobId, undefined, stored);
    result.#json = json;
    result.#received = true;
    let parsed: { readonly value: unknown } | undefined;
    // An own accessor in place of the own data property: read like any result's value.
    Object.defineProperty(result, 'value', {
      enumerable: true,
      get: () => {
        parsed ??= { value: parseJson(json) };
        return parsed.value;
      },
    });
    return result;
  }

  /**
   * `result` handed to another job (a flight's joiner, the cache in front of a queue) with its
   * bytes `json`. A received result stays unparsed: each holder parses its own copy if it reads
   * the value.
   */
  static again(jobId: string, result: JobResult, json: Uint8Array, stored = false): ComputedResult {
    return result instanceof ComputedResult && result.#received
      ? ComputedResult.received(jobId, json, stored)
      : ComputedResult.withJson(jobId, result.value, json, stored);
  }
}

/** A result read back from the cache: the bytes are authoritative, the value is parsed lazily. */
export class StoredResult implements JobResult {
  readonly fromCache = true;
  readonly #job: { readonly id: string };
  #value: unknown;
  #parsed = false;

  /** `job`: whose hit this is; its id is read when `jobId` is (a job may draw it only then). */
  constructor(
    job: { readonly id: string },
    readonly bytes: Uint8Array,
  ) {
    this.#job = job;
  }

  get jobId(): string {
    return this.#job.id;
  }

  get value(): unknown {
    if (!this.#parsed) {
      this.#value = parseJson(this.bytes);
      this.#parsed = true;
    }
    return this.#value;
  }

  json(): Uint8Array {
    return this.bytes;
  }
}

/**
 * What {@link SharedStoredResult} remembers: each held entry's parsed, deep-frozen value, keyed
 * by the entry object the memory store holds. An entry object is held under one key only (the
 * store copies what it is handed, and every entry's envelope names its key's digest), so a value
 * is shared between the hits of one key, never between keys, viewers or caches; it goes when
 * the entry does.
 */
export type SharedValues = WeakMap<object, unknown>;

/**
 * A hit served from process memory with `values: 'shared'`: its value is the entry's one parsed
 * value, deep-frozen, the same object for every hit of that entry. Nothing a caller does to it
 * can change what another hit gets (a write throws in strict code, is ignored otherwise).
 */
export class SharedStoredResult extends StoredResult {
  readonly #entry: object;
  readonly #values: SharedValues;

  constructor(
    job: { readonly id: string },
    bytes: Uint8Array,
    entry: object,
    values: SharedValues,
  ) {
    super(job, bytes);
    this.#entry = entry;
    this.#values = values;
  }

  override get value(): unknown {
    let value = this.#values.get(this.#entry);
    // JSON.parse never yields `undefined`: it means "not parsed yet".
    if (value === undefined) {
      value = deepFreeze(super.value);
      this.#values.set(this.#entry, value);
    }
    return value;
  }
}

/**
 * A hit served from process memory with `values: 'cloned'`: its value is a deep copy of the
 * entry's one parsed, deep-frozen value (kept as `'shared'` keeps it), made once per result: a
 * value of its own that the caller may change, for a copy instead of a parse. The benchmark's
 * rows: 1 KiB ≈ 1.5 µs against ≈ 4.1 µs to parse, 64 KiB ≈ 101 µs against ≈ 269 µs.
 */
export class ClonedStoredResult extends SharedStoredResult {
  #copy: unknown;
  #copied = false;

  override get value(): unknown {
    if (!this.#copied) {
      const copy = copyJson(super.value, 0);
      // Nesting too deep to copy on the call stack: parsed from the bytes, as `'fresh'` does.
      this.#copy = copy === TOO_DEEP ? parseJson(this.bytes) : copy;
      this.#copied = true;
    }
    return this.#copy;
  }
}

/** The value of UTF-8 JSON bytes. */
function parseJson(bytes: Uint8Array): unknown {
  // `toString()` with no argument is the Buffer's own UTF-8 slice: no view built per parse.
  return JSON.parse(
    (Buffer.isBuffer(bytes)
      ? bytes
      : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength)
    ).toString(),
  );
}

const TOO_DEEP: unique symbol = Symbol('too deep to copy');
/** Deeper than this, {@link copyJson} gives up: a recursion far from the call stack's limit. */
const COPY_MAX_DEPTH = 1000;

/**
 * A deep copy of a value `JSON.parse` produced: new arrays and plain objects all the way down,
 * the same keys in the same order, nothing shared with `value`, nothing frozen. Object spread
 * copies own properties as data properties, so an own `"__proto__"` key stays a key (a copy by
 * assignment would set the prototype instead), and the later writes below only replace own
 * data properties. Recursive, with `new Array` and `for…in` (1.6–1.8× faster than with `slice`
 * and `Object.keys`); {@link TOO_DEEP} past {@link COPY_MAX_DEPTH} levels.
 */
function copyJson(value: unknown, depth: number): unknown {
  if (typeof value !== 'object' || value === null) return value;
  if (depth >= COPY_MAX_DEPTH) return TOO_DEEP;
  if (Array.isArray(value)) {
    const length = value.length;
    const out: unknown[] = new Array(length);
    for (let i = 0; i < length; i++) {
      const item = copyJson(value[i], depth + 1);
      if (item === TOO_DEEP) return TOO_DEEP;
      out[i] = item;
    }
    return out;
  }
  const out: Record<string, unknown> = { ...value };
  for (const key in out) {
    // `for…in` also walks enumerable keys a polluted Object.prototype would add: own keys only.
    if (!Object.hasOwn(out, key)) continue;
    const item = out[key];
    if (typeof item === 'object' && item !== null) {
      const copy = copyJson(item, depth + 1);
      if (copy === TOO_DEEP) return TOO_DEEP;
      out[key] = copy;
    }
  }
  return out;
}

/**
 * Freezes a parsed JSON value and everything in it. With a stack of its own rather than
 * recursion: JSON.parse reads nesting deeper than the call stack allows.
 */
export function deepFreeze<T>(value: T): T {
  const todo: unknown[] = [value];
  while (todo.length > 0) {
    const next = todo.pop();
    if (typeof next !== 'object' || next === null || Object.isFrozen(next)) continue;
    Object.freeze(next);
    if (Array.isArray(next)) {
      for (let i = 0; i < next.length; i++) todo.push(next[i]);
    } else {
      for (const key of Object.keys(next)) todo.push((next as Record<string, unknown>)[key]);
    }
  }
  return value;
}
