import { randomBytes } from 'node:crypto';
import { Cluster, type Redis } from 'ioredis';
import { StoreNotReadyError, StoreUnavailableError } from '../errors.js';
import { EpochView, fieldOf, formatTag, newIncarnation, parseField } from './epoch_view.js';
import type { CacheInvalidation, InvalidationScope } from './store.js';

/**
 * Explicit invalidation shared by every process on one Redis, through epochs.
 *
 * Redis holds one hash (`<prefix>epochs`): an epoch per workspace (`w:<ws>`) and per
 * (workspace, path) (`p:<ws>\0<path>`), bumped by `invalidate`, plus a random incarnation
 * (`_id`) so that a Redis that lost its data can never hand out an epoch a process has already
 * seen. A bump and its announcement on the channel are one Lua script: no process can read the
 * new epoch without the message having been published.
 *
 * Every run's key carries the epochs current when it *starts* (`withEpochs` in
 * `cache/cache_epochs.ts`), so:
 * - after an invalidation, lookups compute new keys: nothing written before it is reachable;
 * - a run that started before it and finishes after writes under the old key, which nobody
 *   looks up any more (and the result cache does not even write it: its key input moved). That
 *   is the fence: it holds whatever the interleaving, with no lock.
 *
 * The epochs a process uses come from memory while its subscriber is confirmed (subscribed, the
 * hash loaded after subscribing, and answering heartbeats): the hit path costs two Map lookups.
 * While it is not confirmed, each lookup reads the epochs from Redis (one HMGET); when that fails
 * too, the lookup rejects and the run goes uncached. Nothing is ever served on an epoch view
 * that could not be confirmed.
 *
 * Before the view is confirmed for the first time, the bus is *opening*: lookups and
 * invalidations wait for the first confirmation (within `timeoutMs`), so a store used right
 * after it is made still caches; if Redis has not been reached by then (or the first attempt
 * failed), they refuse with {@link StoreNotReadyError} until it is. `ready()` waits for it.
 */
export class RedisInvalidationBus implements CacheInvalidation {
  readonly #client: Redis | Cluster;
  readonly #subscriber: Redis | Cluster;
  readonly #hashKey: string;
  readonly #channel: string;
  readonly #timeoutMs: number;
  readonly #heartbeatMs: number;
  readonly #dropped: (workspace: string, path?: string) => void;
  #view: EpochView | null = null;
  /**
   * Bumps heard while the hash is being loaded: a bump made after the load read the hash must
   * not be lost, so they are applied on top of what the load returns.
   */
  #heard: [id: string, epoch: number, field: string][] | null = null;
  /** Bumped on every connection change, so a load that raced one is discarded. */
  #session = 0;
  #heartbeat: NodeJS.Timeout | null = null;
  #pinging = false;
  #closed = false;
  readonly #confirmedWaiters: (() => void)[] = [];
  /** Whether the view was ever confirmed (the bus has opened): from then on, the Redis fallback. */
  #opened = false;
  /**
   * Settles when the first connection attempt is over: confirmed, or failed. `null` after that.
   * Lookups and invalidations made meanwhile wait for it rather than fail on a socket not up yet.
   */
  #opening: Promise<void> | null;
  #endOpening: () => void = () => {};
  /** Why the bus has not opened, for the refusal's `cause` (the last connection failure). */
  #lastFailure: unknown = undefined;
  /** The subscribed connection's name in `CLIENT LIST`, for operators (and fault tests). */
  readonly connectionName: string;

  constructor(options: {
    client: Redis | Cluster;
    prefix: string;
    timeoutMs: number;
    heartbeatMs: number;
    /**
     * Called with what was invalidated, a workspace or one runnable's path in it (drop what
     * memory holds of it). The path is the one the message carries (the hash field's own text).
     */
    dropped: (workspace: string, path?: string) => void;
  }) {
    this.#client = options.client;
    this.#hashKey = `${options.prefix}epochs`;
    this.#channel = `${options.prefix}invalidations`;
    this.#timeoutMs = options.timeoutMs;
    this.#heartbeatMs = options.heartbeatMs;
    this.#dropped = options.dropped;
    this.#opening = new Promise<void>((resolve) => {
      this.#endOpening = () => {
        this.#opening = null;
        resolve();
      };
    });
    const client = this.#client;
    this.connectionName = `viewer-cache:invalidations:${randomBytes(4).toString('hex')}`;
    // One more connection, for subscribing: a subscribed connection can issue no other commands.
    this.#subscriber =
      client instanceof Cluster
        ? client.duplicate(undefined, {
            enableOfflineQueue: true,
            redisOptions: { ...client.options.redisOptions, connectionName: this.connectionName },
          })
        : client.duplicate({
            connectionName: this.connectionName,
            enableOfflineQueue: true,
            maxRetriesPerRequest: null,
            lazyConnect: false,
            retryStrategy: (attempt: number) => Math.min(50 * 2 ** attempt, 2000),
          });
    const subscriber = this.#subscriber;
    // Every failure is a 'close' too, which unconfirms (and ends the opening attempt).
    subscriber.on('error', (err: unknown) => {
      this.#lastFailure = err;
    });
    subscriber.on('ready', () => void this.#resync());
    // A connection that closes before the bus ever opened ends the opening attempt too.
    const lost = () => {
      this.#unconfirm();
      this.#endOpening();
    };
    subscriber.on('close', lost);
    subscriber.on('end', lost);
    subscriber.on('message', (channel: string, message: string) => {
      if (channel === this.#channel) this.#received(message);
    });
    if (subscriber.status === 'ready') void this.#resync();
    this.#heartbeat = setInterval(() => this.#beat(), this.#heartbeatMs);
    this.#heartbeat.unref();
  }

  /** Whether this process's epochs are confirmed (lookups use memory, no round trip). */
  get confirmed(): boolean {
    return this.#view !== null;
  }

  /** Whether the view was ever confirmed: until then, lookups refuse with `E_STORE_NOT_READY`. */
  get opened(): boolean {
    return this.#opened;
  }

  /** Resolves when the view is confirmed (now, if it is). Unbounded: see {@link ready}. */
  whenConfirmed(): Promise<void> {
    if (this.#view !== null) return Promise.resolve();
    return new Promise((resolve) => this.#confirmedWaiters.push(resolve));
  }

  /**
   * Resolves once the view is confirmed (now, if it is); rejects with {@link StoreNotReadyError}
   * (the last connection failure as its `cause`) if it is not within `timeoutMs`.
   */
  ready(timeoutMs: number): Promise<void> {
    if (this.#view !== null) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        const at = this.#confirmedWaiters.indexOf(done);
        if (at >= 0) this.#confirmedWaiters.splice(at, 1);
        reject(this.#notReady(`not confirmed within ${timeoutMs} ms`));
      }, timeoutMs);
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      this.#confirmedWaiters.push(done);
    });
  }

  tag(workspace: string, path: string): string | Promise<string> {
    const view = this.#view;
    if (view !== null) return view.tag(workspace, path);
    if (!this.#opened) return this.#untilOpened().then(() => this.tag(workspace, path));
    return this.#fetchTag(workspace, path);
  }

  async invalidate(scope: InvalidationScope): Promise<void> {
    const field = fieldOf(scope);
    if (!this.#opened) await this.#untilOpened();
    const [id, epoch] = await bounded(
      bump(this.#client, this.#hashKey, this.#channel, field),
      'invalidate',
      this.#timeoutMs,
    );
    // This process sees its own invalidation now, not when its message comes back.
    this.#apply(id, epoch, field);
  }

  async close(): Promise<void> {
    this.#closed = true;
    if (this.#heartbeat !== null) clearInterval(this.#heartbeat);
    this.#heartbeat = null;
    this.#unconfirm();
    this.#endOpening();
    await this.#bounded(this.#subscriber.quit(), 'quit').catch(() => this.#subscriber.disconnect());
  }

  /** Subscribes (again), then loads the whole hash: messages from then on are not missed. */
  async #resync(): Promise<void> {
    if (this.#closed) return;
    this.#unconfirm();
    const session = this.#session;
    const heard: [string, number, string][] = [];
    this.#heard = heard;
    try {
      await this.#bounded(this.#subscriber.subscribe(this.#channel), 'subscribe');
      // The commands' connection may still be connecting (a client with no offline queue
      // would refuse the load): wait for it, within the timeout, like every command.
      await connected(this.#client, this.#timeoutMs);
      const [, all] = (await this.#bounded(
        this.#client
          .multi()
          .hsetnx(this.#hashKey, '_id', newIncarnation())
          .hgetall(this.#hashKey)
          .exec(),
        'load',
      )) as [[Error | null, unknown], [Error | null, Record<string, string>]];
      if (all[0] !== null) throw all[0];
      if (session !== this.#session || this.#closed) return;
      const view = EpochView.load(all[1]);
      this.#heard = null;
      this.#view = view;
      for (const [id, epoch, field] of heard) this.#apply(id, epoch, field);
      if (this.#view !== view) return; // one of them was from another incarnation: resyncing
      this.#opened = true;
      this.#endOpening();
      for (const resolve of this.#confirmedWaiters.splice(0)) resolve();
    } catch (err) {
      this.#lastFailure = err;
      // The first attempt failed: refuse from now on instead of making every lookup wait.
      this.#endOpening();
      // Not confirmed: lookups keep reading Redis. Force a reconnect, which resyncs on 'ready'.
      if (session === this.#session && !this.#closed) this.#subscriber.disconnect(true);
    }
  }

  #unconfirm(): void {
    this.#session++;
    this.#view = null;
    this.#heard = null;
  }

  /** A bump announced by any process (this one included): `<id>\n<epoch>\n<field>`. */
  #received(message: string): void {
    const a = message.indexOf('\n');
    const b = message.indexOf('\n', a + 1);
    if (a < 0 || b < 0) return;
    this.#apply(message.slice(0, a), Number(message.slice(a + 1, b)), message.slice(b + 1));
  }

  #apply(id: string, epoch: number, field: string): void {
    const view = this.#view;
    if (view === null) this.#heard?.push([id, epoch, field]);
    else {
      if (view.id !== id) {
        // Redis lost its epochs (restart, flush): nothing in memory can be trusted.
        void this.#resync();
      } else {
        view.raise(field, epoch);
      }
    }
    const scope = parseField(field);
    if (scope !== null) this.#dropped(scope.workspace, scope.path);
  }

  /**
   * A PING through the subscribed connection: a stalled connection (no RST, no reply) would
   * otherwise stay "confirmed" while messages no longer arrive. Bound: heartbeat + timeout.
   */
  #beat(): void {
    if (this.#pinging || this.#closed || this.#subscriber.status !== 'ready') return;
    this.#pinging = true;
    const session = this.#session;
    this.#bounded(this.#subscriber.ping(), 'ping').then(
      () => {
        this.#pinging = false;
      },
      () => {
        this.#pinging = false;
        if (session !== this.#session || this.#closed) return;
        this.#unconfirm();
        this.#subscriber.disconnect(true);
      },
    );
  }

  /** Waits for the opening attempt (within the timeout); refuses if the bus did not open. */
  async #untilOpened(): Promise<void> {
    const opening = this.#opening;
    if (opening !== null) {
      let timer: NodeJS.Timeout | undefined;
      await Promise.race([
        opening,
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, this.#timeoutMs);
        }),
      ]);
      clearTimeout(timer);
    }
    if (!this.#opened) throw this.#notReady('Redis has not answered yet');
  }

  #notReady(why: string): StoreNotReadyError {
    const cause = this.#lastFailure;
    return new StoreNotReadyError(
      `the two-tier cache store is not ready (${why}): its invalidation bus has not loaded the epochs from Redis; await openTwoTierStore(...) or store.ready() before using it`,
      cause === undefined ? {} : { cause },
    );
  }

  async #fetchTag(workspace: string, path: string): Promise<string> {
    const [, values] = (await this.#bounded(
      this.#client
        .multi()
        .hsetnx(this.#hashKey, '_id', newIncarnation())
        .hmget(this.#hashKey, '_id', `w:${workspace}`, `p:${workspace}\0${path}`)
        .exec(),
      'epochs',
    )) as [[Error | null, unknown], [Error | null, (string | null)[]]];
    if (values[0] !== null) throw new StoreUnavailableError('redis epochs failed');
    const [id, w, p] = values[1];
    return formatTag(id ?? '', Number(w ?? 0), Number(p ?? 0));
  }

  #bounded<T>(command: Promise<T>, op: string): Promise<T> {
    return bounded(command, op, this.#timeoutMs);
  }
}

/**
 * Invalidates `scope` for every process using `redis` under `prefix` (what `invalidate` on a
 * two-tier store does), from a process that keeps no cache itself: the CLI, a deploy hook.
 * Resolves to how many subscribers heard the publish (on a Cluster: those of the node that
 * served it); 0 means no process under `prefix` was listening — the epoch moved all the same,
 * so a process that starts or resubscribes later reads it.
 */
export async function publishInvalidation(
  redis: Redis | Cluster,
  scope: InvalidationScope,
  options: { prefix?: string; timeoutMs?: number } = {},
): Promise<{ receivers: number }> {
  const prefix = options.prefix ?? 'vc:';
  const field = fieldOf(scope);
  const [, , receivers] = await bounded(
    bump(redis, `${prefix}epochs`, `${prefix}invalidations`, field),
    'invalidate',
    options.timeoutMs ?? 2000,
  );
  return { receivers };
}

async function bump(
  client: Redis | Cluster,
  hashKey: string,
  channel: string,
  field: string,
): Promise<[id: string, epoch: number, receivers: number]> {
  const [id, epoch, receivers] = (await client.eval(
    BUMP_SCRIPT,
    1,
    hashKey,
    newIncarnation(),
    field,
    channel,
  )) as [string, number, number];
  return [String(id), Number(epoch), Number(receivers)];
}

/**
 * Resolves when `client` is ready for commands (at once, if it is); rejects when it ends, or after
 * `timeoutMs`. Its listeners go either way: a resync that gives up while Redis stays down must
 * not leave a pair on the shared client each time.
 */
function connected(client: Redis | Cluster, timeoutMs: number): Promise<void> {
  if (client.status === 'ready') return Promise.resolve();
  return new Promise<void>((resolve, reject) => {
    const settle = (err?: Error) => {
      clearTimeout(timer);
      client.off('ready', ready);
      client.off('end', ended);
      if (err === undefined) resolve();
      else reject(err);
    };
    const ready = () => settle();
    const ended = () =>
      settle(new StoreUnavailableError('redis connect failed: the connection ended'));
    const timer = setTimeout(
      () => settle(new StoreUnavailableError(`redis connect timed out after ${timeoutMs} ms`)),
      timeoutMs,
    );
    client.on('ready', ready).on('end', ended);
  });
}

function bounded<T>(command: Promise<T>, op: string, timeoutMs: number): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    const timer = setTimeout(
      () => reject(new StoreUnavailableError(`redis ${op} timed out after ${timeoutMs} ms`)),
      timeoutMs,
    );
    command.then(
      (value) => {
        clearTimeout(timer);
        resolve(value);
      },
      (cause: unknown) => {
        clearTimeout(timer);
        reject(new StoreUnavailableError(`redis ${op} failed`, { cause }));
      },
    );
  });
}

/**
 * Bump one epoch and announce it, atomically: `KEYS[1]` the hash, `ARGV` a fresh incarnation
 * (used only if the hash has none), the field, the channel.
 */
const BUMP_SCRIPT = `
redis.call('HSETNX', KEYS[1], '_id', ARGV[1])
local n = redis.call('HINCRBY', KEYS[1], ARGV[2], 1)
local id = redis.call('HGET', KEYS[1], '_id')
local heard = redis.call('PUBLISH', ARGV[3], id .. '\\n' .. n .. '\\n' .. ARGV[2])
return {id, n, heard}
`;
