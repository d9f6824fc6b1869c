import { type Cluster, Command, Redis } from 'ioredis';
import { type Duration, resolveDuration } from '../duration.js';
import { StoreUnavailableError } from '../errors.js';
import { type CorkableClient, corkForTick } from '../util/tick_cork.js';
import { affinityFor } from '../util/write_affinity.js';
import { DeadlineQueue } from './deadline_queue.js';
import { isIoredisClient } from './redis_client.js';
import type { CacheStore } from './store.js';

export interface RawRedisCacheStoreOptions {
  /**
   * A `redis://` URL (the store opens and owns the connection), or an existing ioredis `Redis`
   * or `Cluster` client (the store only borrows it, and never closes it).
   */
  redis: string | Redis | Cluster;
  /**
   * Prefix of every key this store writes, so several caches can share a Redis.
   * @default 'vc:'
   */
  prefix?: string;
  /**
   * Longest a command may take before the store gives up on it; the middleware then runs the
   * job uncached. Bounded so that a slow Redis cannot make cached runs slower than uncached ones.
   * @default 200 (ms)
   */
  commandTimeout?: Duration;
}

/**
 * A turn's GETs leave in parts of this many, not all at its end, so that Redis works on the
 * first part while this process builds the next. Held whole, this process idled ~17 % of the
 * time at 64 callers. 1 KiB hits, 64 callers, the CPU per hit unchanged (parts of 24 to 48 did
 * about as well): `bench/hit_ab.ts`, twice, unsealed 0.50–0.53× a raw GET's hits/s before,
 * 0.77× after; sealed 0.82–0.83× the sealed floor before, 0.94–0.97× after. One caller's p50
 * and the HTTP server's rows (`bench/outsider_http.ts --baseline`) did not move.
 */
const TURN_SPLIT = 32;

/**
 * A store on Redis (single node or Cluster) through ioredis. Values are raw bytes (`GET` returns
 * a Buffer, never a decoded string), expiry is Redis's own `PX`.
 *
 * Failure policy: every command either settles within `commandTimeout` or rejects with
 * {@link StoreUnavailableError}; nothing is queued while Redis is unreachable (for clients this
 * store opens, the offline queue is off and retries per request are zero).
 */
export class RedisCacheStore implements CacheStore {
  /** Other processes (and whoever holds the Redis password) reach it: used sealed by default. */
  readonly shared = true;
  readonly #client: Redis | Cluster;
  readonly #owned: boolean;
  readonly #prefix: string;
  readonly #timeoutMs: number;
  readonly #deadlines: DeadlineQueue;
  /**
   * While the first connection attempt of a client this store opened is under way: commands
   * wait for it (within their timeout) rather than fail because the socket is not up yet, which
   * would count as a store failure and make the middleware rest. `null` ever after.
   */
  #connecting: Promise<void> | null = null;
  /** Whether this turn of the event loop has sent its first GET (see #batchThisTurn). */
  #turn = false;
  /** GETs sent this turn. */
  #turnGets = 0;
  /** Whether the last turn with GETs had company for its first (see #batchThisTurn). */
  #busy = false;
  /** The socket held corked since this turn's second GET, until it is flushed; else `null`. */
  #corked: Redis['stream'] | null = null;
  /** The next GET's command, built ahead (see #getDirect); `null` until the first GET. */
  #spare: Command | null = null;

  constructor(options: RawRedisCacheStoreOptions) {
    if (options === null || typeof options !== 'object') {
      throw new TypeError('RedisCacheStore needs options with a `redis` URL or client');
    }
    this.#prefix = options.prefix ?? 'vc:';
    if (typeof this.#prefix !== 'string') throw new TypeError('prefix must be a string');
    this.#timeoutMs = resolveDuration(options.commandTimeout ?? 200, 'commandTimeout');
    if (this.#timeoutMs <= 0) throw new TypeError('commandTimeout must be greater than 0');
    const { redis } = options;
    if (typeof redis === 'string') {
      this.#client = new Redis(redis, {
        enableOfflineQueue: false,
        maxRetriesPerRequest: 0,
        // No ioredis `commandTimeout`: #bounded already bounds every command, with one timer
        // per store. ioredis's option arms and clears a timer per command (and `delete`s it,
        // turning each Command into a dictionary-mode object); dropping it measured 0.6–0.9 µs
        // less p50 per GET for one caller (1 KiB, 4 of 4 interleaved runs, ~2% of the GET).
        // A command that times out now rejects with "redis get timed out after N ms", as on a
        // borrowed client, instead of "redis get failed" caused by "Command timed out".
        // Reconnect forever with a capped backoff: the cache comes back on its own.
        retryStrategy: (attempt) => Math.min(50 * 2 ** attempt, 2000),
      });
      // Connection errors surface as rejected commands; without a listener ioredis would print
      // every reconnect attempt to stderr.
      this.#client.on('error', () => {});
      this.#owned = true;
      const client = this.#client;
      this.#connecting = new Promise<void>((resolve) => {
        const attempted = () => {
          this.#connecting = null;
          client.off('ready', attempted).off('close', attempted).off('end', attempted);
          resolve();
        };
        client.on('ready', attempted).on('close', attempted).on('end', attempted);
      });
    } else if (isIoredisClient(redis)) {
      this.#client = redis;
      this.#owned = false;
    } else {
      throw new TypeError(
        'redis must be a redis:// URL, or an ioredis (5.x or 6.x) Redis or Cluster client',
      );
    }
    this.#deadlines = new DeadlineQueue(this.#timeoutMs);
  }

  /** The connection commands go through (shared by `TwoTierCacheStore`'s invalidation bus). */
  get client(): Redis | Cluster {
    return this.#client;
  }

  get(key: string): Promise<Uint8Array | null> {
    const k = this.#prefix + key;
    const connecting = this.#connecting;
    if (connecting !== null) {
      return this.#bounded(
        connecting.then(() => this.#client.getBuffer(k)),
        'get',
      );
    }
    this.#batchThisTurn();
    const client = this.#client;
    // The direct path builds ioredis's Command itself: only for a client of the same ioredis as
    // this module (ioredis is a peer: normally the one there is).
    const reply =
      client instanceof Redis && !client.options.enableAutoPipelining
        ? this.#getDirect(client, k)
        : this.#bounded(client.getBuffer(k), 'get');
    if (this.#corked !== null && this.#turnGets % TURN_SPLIT === 0) this.#flush();
    return reply;
  }

  /**
   * The hit's GET with no promise of our own: the command is built here (what `getBuffer` does,
   * minus its argument juggling), its `reject` is wrapped so that its own promise settles as
   * this store promises (every failure a StoreUnavailableError), and the deadline queue holds
   * the command itself, rejecting it when overdue as ioredis's own `commandTimeout` does; a
   * reply that comes after that settles nothing. Wrapping rather than chaining `then` saves a
   * hit one promise and one turn of the microtask queue between the reply and its caller.
   * Only for a single-node client without auto-pipelining (others go through `getBuffer`, so a
   * borrowed client's settings keep working); a borrowed client's key prefix still applies.
   *
   * Each GET takes the command the GET before it built once its own write had left, and builds
   * the next one the same way: as many commands as before, but none built between a reply and
   * the GET that follows it. Built there, right after the process woke for the reply, a command
   * took 1.9–2.1 µs (timed with marks in a scratch build; a raw GET spends 3 µs before its
   * write); `bench/redis_split.ts` (1 KiB, one caller) put the store's time before its write at
   * 4.1 µs before this change and 2.7 µs after. Not for a client with a key prefix: ioredis
   * prefixes a command's keys when it builds it.
   */
  #getDirect(client: Redis, k: string): Promise<Uint8Array | null> {
    let command = this.#spare;
    if (command === null) {
      command = this.#newGet(client, k);
    } else {
      this.#spare = null;
      command.args[0] = k;
    }
    this.#deadlines.addCommand(command);
    client.sendCommand(command);
    if (!client.options.keyPrefix) this.#spare = this.#newGet(client, '');
    return command.promise as Promise<Buffer | null>;
  }

  /** A GET of `k`, not sent, whose promise settles as this store promises (see #getDirect). */
  #newGet(client: Redis, k: string): Command {
    const command = new Command('get', [k], {
      replyEncoding: null,
      keyPrefix: client.options.keyPrefix,
    });
    // ioredis settles a command through `resolve` and `reject` (a lost connection, say); the
    // reply is handed on as it is.
    const reject = command.reject;
    command.reject = (cause: Error) => {
      // Our own deadline rejects the command with the error it means already.
      reject(
        cause instanceof StoreUnavailableError
          ? cause
          : new StoreUnavailableError('redis get failed', { cause }),
      );
    };
    return command;
  }

  /**
   * Sends the GETs of one turn of the event loop after the first in one socket write, instead of
   * one syscall each (a loopback write is the costliest step of a GET: 68 % of a raw GET's busy
   * time at 64 callers). The first GET of a turn is written at once, so a lone caller pays only
   * the scheduling: corking from the first GET on measured a store GET at 1.19–1.31× a raw GET's
   * p50 (1 KiB, one caller), against 1.12–1.14× this way.
   *
   * Two kinds of company, two flushes:
   * - GETs issued in the *same tick* as the turn's first (callers resumed together by one batch
   *   of replies) leave when that tick ends, as one `writev`: nothing else runs before it.
   * - GETs issued by *later ticks of the turn* (an HTTP server's requests, each in its own
   *   socket's callback) leave together when the turn's I/O callbacks are done (`setImmediate`).
   *   Flushing per tick wrote each of those on its own: the reference server made 3.10 write
   *   syscalls per cached request at 8 connections, against 2.74–2.79 this way, and the
   *   synchronous part of its hit took 30–40 µs against 17–23 µs.
   *
   * Under load the first GET has company too: once a turn has sent more than one GET, the next
   * turn's first GET is held with the rest and everything leaves at the end of that turn, one
   * write per turn instead of two. The reference server, Redis only, made 1.31–1.32 writes per
   * cached request at 16 connections against 1.48 (1.13 against 1.17–1.19 at 64), with
   * req/s ÷ the floor route 0.74–0.77× against 0.63–0.73× (`bench/outsider_http.ts`, busy
   * machine). A turn with one GET sets it back: the GET after it leaves at once again.
   *
   * ioredis's own `enableAutoPipelining` batches through a Pipeline per tick, which measured
   * +39–86 % single-caller p50.
   *
   * Whatever the replies' size. Batching once stopped after a reply over 16 KiB (64 KiB replies,
   * 64 callers: 0.76–0.82× a raw GET's throughput batched, 0.82–0.97× not), but that was before
   * turns left in parts of {@link TURN_SPLIT}; with parts, batched 64 KiB hits read 0.93–1.15×
   * a raw GET's hits/s against 0.70–0.84× unbatched, and sealed 0.97–1.14× the sealed floor
   * against 0.87–1.05× (`bench/hit_ab.ts --bytes 65536`, four runs, one with the builds
   * swapped); at 8 callers 1.10× against 0.99× (`bench/hit_alternate.ts --callers 8`).
   *
   * Only on a single-node client that is ready (a Cluster spreads commands over several
   * sockets); the stream corked is the one uncorked, even if the client reconnects meanwhile.
   *
   * A large turn leaves in parts of {@link TURN_SPLIT}: held whole, Redis waits while this
   * process builds the turn's GETs, then this process waits while Redis answers them all.
   */
  #batchThisTurn(): void {
    if (!this.#turn) {
      this.#turn = true;
      this.#turnGets = 1;
      setImmediate(this.#endTurn);
      // A lone GET leaves at once; behind a busy turn, the first waits for the turn's company.
      if (!this.#busy) {
        process.nextTick(this.#flush);
        return;
      }
    } else {
      this.#turnGets += 1;
    }
    if (this.#corked !== null) return;
    const client = this.#client;
    if (client.isCluster || client.status !== 'ready') return;
    const stream = (client as Redis).stream;
    if (!stream.writable) return;
    stream.cork();
    this.#corked = stream;
  }

  /** Sends what is corked: at the end of the turn's first tick, and at the end of the turn. */
  readonly #flush = (): void => {
    const corked = this.#corked;
    this.#corked = null;
    corked?.uncork();
  };

  readonly #endTurn = (): void => {
    this.#turn = false;
    this.#busy = this.#turnGets > 1;
    this.#flush();
  };

  async set(key: string, value: Uint8Array, ttlMs: number): Promise<void> {
    const k = this.#prefix + key;
    const px = Math.max(1, Math.ceil(ttlMs));
    const buffer = Buffer.isBuffer(value)
      ? value
      : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
    const connecting = this.#connecting;
    // A queue worker's job: its entry goes on the worker's connection when that reaches this
    // very server (see write_affinity.ts), bounded like any write of this store's.
    const via = connecting === null ? (affinityFor(this.#client) as Redis | null) : null;
    const client = via ?? this.#client;
    // Misses that finish in one tick (callers resumed together, a worker's jobs) write their
    // entries in one syscall.
    if (connecting === null) corkForTick(client as CorkableClient);
    await this.#bounded(
      connecting === null
        ? client.set(k, buffer, 'PX', px)
        : connecting.then(() => client.set(k, buffer, 'PX', px)),
      'set',
    );
  }

  async delete(key: string): Promise<void> {
    const k = this.#prefix + key;
    const connecting = this.#connecting;
    await this.#bounded(
      connecting === null ? this.#client.del(k) : connecting.then(() => this.#client.del(k)),
      'delete',
    );
  }

  /** Closes the connection if this store opened it; a borrowed client is left to its owner. */
  async close(): Promise<void> {
    if (!this.#owned) return;
    // Bounded like any command: a server that stopped answering must not hang close().
    await this.#bounded(this.#client.quit(), 'quit').catch(() => this.#client.disconnect());
  }

  /**
   * Settles `command` within the timeout, mapping every failure to StoreUnavailableError. The
   * bound matters most for borrowed clients, whose own settings may queue commands while offline.
   */
  #bounded<T>(command: Promise<T>, op: string): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      const pending = this.#deadlines.add(op, reject);
      command.then(
        (value) => {
          pending.settled = true;
          resolve(value);
        },
        (cause: unknown) => {
          pending.settled = true;
          reject(new StoreUnavailableError(`redis ${op} failed`, { cause }));
        },
      );
    });
  }
}
