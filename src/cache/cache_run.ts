import type { Job, RunOptions } from '../job.js';
import { pathTag } from '../stores/path_tag.js';
import { MemoAdmission } from '../util/memo_admission.js';
import { RecentMemo } from '../util/recent_memo.js';
import type { EntryCodec } from './cache_entry.js';
import { canonicalKeyInput, type KeyDigest, keyName } from './cache_key.js';
import { KeyPartsMemo } from './key_parts_memo.js';

/** One cached run: what every step after the key needs, carried as one object. */
export class CacheRun {
  constructor(
    readonly job: Job,
    /** The store key: workspace, runnable, args, viewer and fingerprint, through the digest. */
    readonly key: string,
    /** The digest the key is named after; the entry must carry (or be sealed under) it. */
    readonly digest: KeyDigest,
    /** The fingerprint the key was built with; a result is stored only if it still holds. */
    readonly fingerprint: string | null,
    readonly ttlMs: number,
    /** What the wrapped executor is handed (the dispatcher for child jobs). */
    readonly passDown: RunOptions,
    /** The runnable's `pathTag`, handed to the store; `undefined` when it cannot use one. */
    readonly tag: string | undefined,
  ) {}
}

/** Two generations of this many: at most 4096 names held, as before (≈ 2.5 MB full). */
const DIGEST_MEMO_GENERATION = 2048;

/**
 * A digest with its store key, built once: a hit reuses a string whose hash V8 has already
 * computed, where a key built per hit is hashed again by the flight lookup and copied flat again
 * by the store's command.
 */
interface NamedDigest {
  readonly digest: KeyDigest;
  readonly key: string;
  readonly tag: string | undefined;
}

/** Names runs: the canonical key input, its digest (keyed when sealing) and the store key. */
export class CacheRuns {
  readonly #codec: EntryCodec;
  /**
   * Recent key inputs' digests. A hit's key input was, by definition, seen before: this skips
   * the hash (and, sealed, the HMAC) for it. A pure function of the full input, so it can never
   * hand one key's digest to another. Measured at 1 KiB, one caller: hit p50 1.44–1.54× a raw
   * GET against 1.57–1.67× without, sealed 2.08–2.42× against 2.56–2.79×. Bounded: ~2.5 MB.
   */
  readonly #digests = new RecentMemo<string, NamedDigest>(DIGEST_MEMO_GENERATION);
  /**
   * The same names, found from the job's parts without building its key input (see
   * {@link KeyPartsMemo}): a hit of a run seen recently builds no key text at all.
   */
  readonly #byParts = new KeyPartsMemo<NamedDigest>(DIGEST_MEMO_GENERATION);
  /** Which misses the two memos keep: all, or a sample while they churn (memo_admission.ts). */
  readonly #admission = new MemoAdmission(DIGEST_MEMO_GENERATION);

  /** Whether runs carry their runnable's tag (the store invalidates by path). */
  readonly #tagged: boolean;

  constructor(codec: EntryCodec, tagged: boolean) {
    this.#codec = codec;
    this.#tagged = tagged;
  }

  /** Which misses the memos keep (read by tests). */
  get admission(): Pick<MemoAdmission, 'sampling' | 'kept'> {
    return this.#admission;
  }

  /**
   * The run's full key. Throws (InvalidJobError, ArgsNotJsonError) on a job the key cannot
   * carry: such a run is refused, never cached under a partial key.
   */
  of(job: Job, fingerprint: string | null, ttlMs: number, passDown: RunOptions): CacheRun {
    let named = this.#byParts.get(job, fingerprint);
    if (named !== undefined) {
      this.#admission.looked(true);
    } else {
      const input = canonicalKeyInput(job, fingerprint);
      named = this.#digests.get(input);
      const known = named !== undefined;
      this.#admission.looked(known);
      // A key found in the text memo is one that came back: always worth its parts entry.
      const keep = known || this.#admission.admits();
      if (named === undefined) {
        const digest = this.#codec.digest(input);
        // The workspace and path are the input's second and third elements, so the memoised
        // name and tag are this input's. A hit whose input is memoised computes neither.
        named = {
          digest,
          key: keyName(job.workspace, digest),
          tag: this.#tagged ? pathTag(job.workspace, job.runnable.path) : undefined,
        };
        if (keep) this.#digests.set(input, named);
      }
      if (keep) this.#byParts.set(job, fingerprint, input, named, !known);
    }
    return new CacheRun(job, named.key, named.digest, fingerprint, ttlMs, passDown, named.tag);
  }

  /**
   * The run under a key already derived for this very job (`digest`, from input holding
   * `fingerprint`): a queue worker's job, whose server named the key (named_run.ts). Nothing is
   * memoised: a worker does not see the same key again.
   */
  given(
    job: Job,
    digest: KeyDigest,
    fingerprint: string | null,
    ttlMs: number,
    passDown: RunOptions,
  ): CacheRun {
    const tag = this.#tagged ? pathTag(job.workspace, job.runnable.path) : undefined;
    const key = keyName(job.workspace, digest);
    return new CacheRun(job, key, digest, fingerprint, ttlMs, passDown, tag);
  }
}
