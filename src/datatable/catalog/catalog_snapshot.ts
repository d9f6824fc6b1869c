// Over 450 lines on purpose: one state machine (listener, heartbeat, confirm, reload) whose
// transitions share the same few fields; split, each part would need all of them.
import pg from 'pg';
import { RoleResolutionFailedError } from '../../errors.js';
import type { TypedEmitter } from '../../events.js';
import { type Logger, silentLogger } from '../../logger.js';
import { queryInTurn } from '../../pg/pg_clients.js';
import { CLOSE_WAIT_MS, settleWithin } from '../../util/settle_within.js';
import { type CatalogState, loadCatalogState } from './catalog_state.js';
import { CATALOG_CHANNEL } from './migrations.js';
import { ACK_CHANNEL, PropagationAcks, type PropagationWatch } from './propagation_acks.js';
import * as sql from './sql/catalog_reads.js';

/** What the catalog's snapshot emits (part of `DatatablesEvents`). */
export interface CatalogEvents {
  /** The catalog was reloaded into memory. */
  'catalog:refreshed': { generation: number };
  /** The LISTEN connection went down or came back. */
  'catalog:listener': { up: boolean };
}

export interface CatalogSnapshotOptions {
  /** Pool on the catalog database (reads). */
  pool: pg.Pool;
  /**
   * Connection for the dedicated LISTEN client (a direct one: not through a transaction pooler).
   * Its `application_name`, when set, names the backend. @default name `viewer-cache-listener`
   */
  listenConnection: pg.ClientConfig;
  /** Where `catalog:refreshed` and `catalog:listener` are emitted. */
  events: TypedEmitter<CatalogEvents>;
  logger?: Logger;
  /** Delay before reconnecting a lost listener; doubles up to 5 s. @default 100 */
  reconnectDelayMs?: number;
  /** How often the listener proves it is alive (and reads the generation). @default 1000 */
  heartbeatMs?: number;
  /** A heartbeat not answered within this long declares the listener dead. @default 1000 */
  heartbeatTimeoutMs?: number;
  /**
   * More channels the one listener listens on, with what to do with each payload (learned
   * dependency sets' announcements). @default none
   */
  channels?: Readonly<Record<string, (payload: string) => void>>;
  /**
   * The key propagation acknowledgements are authenticated with (derived from the deployment's
   * secret for this use alone): only processes holding it are counted by `awaitPropagation`.
   */
  ackKey: Uint8Array;
}

/**
 * The catalog, kept in process and fresh through LISTEN/NOTIFY: every catalog change bumps the
 * generation and notifies in the same transaction.
 *
 * Freshness rule (SPEC invariants 10 and 18): the in-memory state is served without a round trip
 * only while (a) no notification has arrived since it was read and (b) the listener proved, less
 * than `heartbeatMs + heartbeatTimeoutMs` ago, that it is alive: every heartbeat is a generation
 * read *through the LISTEN connection*, so it also catches a notification that was lost. A
 * half-open listener therefore stops being trusted within that bound and is replaced. Otherwise
 * every read first confirms the generation with one small query (concurrent callers share it)
 * and reloads when it moved — slower, never stale.
 *
 * Anyone who can connect may `NOTIFY` the channel: a notification only counts when its
 * generation is newer than the one held, and then costs one generation read; a full reload
 * happens only when the generation in Postgres actually moved.
 */
export class CatalogSnapshot {
  readonly #events: TypedEmitter<CatalogEvents>;
  readonly #pool: pg.Pool;
  readonly #listenConfig: pg.ClientConfig;
  readonly #logger: Logger;
  readonly #baseDelayMs: number;
  readonly #heartbeatMs: number;
  readonly #heartbeatTimeoutMs: number;
  #state: CatalogState | null = null;
  #listener: pg.Client | null = null;
  /** Start time (performance.now) of the listener's last answered heartbeat. */
  #aliveAt = Number.NEGATIVE_INFINITY;
  /** Bumped on every notification and listener loss; a read is fresh only if it did not move. */
  #epoch = 0;
  /** No notification or listener loss since the state was last read or confirmed. */
  #fresh = false;
  #loading: { epoch: number; promise: Promise<CatalogState> } | null = null;
  /** A generation check not started yet: callers arriving meanwhile share it. */
  #pendingConfirm: Promise<CatalogState> | null = null;
  #heartbeatTimer: NodeJS.Timeout | undefined;
  #heartbeatRunning = false;
  #reconnectTimer: NodeJS.Timeout | undefined;
  #reconnectDelayMs: number;
  #closed = false;
  /** Reads on the pool under way (generation checks, loads): close() waits for them. */
  readonly #reads = new Set<Promise<unknown>>();
  /** waitForGeneration callers, answered when the snapshot closes. */
  readonly #closeWaiters = new Set<() => void>();
  readonly #acks: PropagationAcks;
  readonly #channels: Readonly<Record<string, (payload: string) => void>>;

  constructor(options: CatalogSnapshotOptions) {
    this.#channels = options.channels ?? {};
    this.#pool = options.pool;
    this.#events = options.events;
    this.#listenConfig = options.listenConnection;
    this.#logger = options.logger ?? silentLogger;
    this.#baseDelayMs = options.reconnectDelayMs ?? 100;
    this.#reconnectDelayMs = this.#baseDelayMs;
    this.#heartbeatMs = options.heartbeatMs ?? 1000;
    this.#heartbeatTimeoutMs = options.heartbeatTimeoutMs ?? 1000;
    this.#acks = new PropagationAcks(this.#pool, this.stalenessBoundMs, options.ackKey);
  }

  /**
   * Call before committing a change: after the commit, `wait(generation)` resolves once every
   * other live process acknowledged it (or the staleness bound passed). Null without a listener.
   */
  watchPropagation(): Promise<PropagationWatch | null> {
    return this.#acks.watch();
  }

  /**
   * Resolves once every live process's next run reflects the catalog as of `generation` (by
   * default: as of now, read from Postgres) — for applications that write governing-table rows
   * on connections of their own, called after their commit. Asks every listener to acknowledge
   * it: one holding it acknowledges at once, one behind stops trusting its memory first (so its
   * next run confirms with Postgres). A listener that does not answer is waited for at most the
   * staleness bound, after which it has stopped trusting its memory anyway.
   */
  async awaitPropagation(
    generation?: number,
  ): Promise<{ generation: number; acknowledged: number; missing: number }> {
    const watch = await this.#acks.watch();
    try {
      const target =
        generation ??
        Number(
          (await this.#pool.query<{ value: string }>(sql.READ_GENERATION)).rows[0]?.value ?? 0,
        );
      if (watch === null) {
        // No listener here: this process reads Postgres on every run; the others are bounded.
        await new Promise((resolve) => setTimeout(resolve, this.stalenessBoundMs).unref());
        return { generation: target, acknowledged: 0, missing: 0 };
      }
      await this.#pool.query('select pg_notify($1, $2)', [CATALOG_CHANNEL, String(target)]);
      const [result] = await Promise.all([watch.wait(target), this.waitForGeneration(target)]);
      return { generation: target, ...result };
    } finally {
      watch?.close();
    }
  }

  /** The longest a change can go unnoticed with the listener silently dead (README). */
  get stalenessBoundMs(): number {
    return this.#heartbeatMs + this.#heartbeatTimeoutMs;
  }

  /** Connects the listener, then loads the first state. */
  async start(): Promise<void> {
    await this.#listen().catch((err: unknown) => {
      this.#logger.warn(
        { err: (err as Error).message },
        'catalog listener could not connect; reading Postgres directly',
      );
      this.#scheduleReconnect();
    });
    await this.#reload();
    this.#heartbeatTimer = setInterval(() => void this.#heartbeat(), this.#heartbeatMs);
    this.#heartbeatTimer.unref();
  }

  /** Whether the listener is connected *and* answered a heartbeat within the bound. */
  get listenerUp(): boolean {
    return this.#listener !== null && this.#alive();
  }

  /** The last loaded generation (0 before the first load). */
  get generation(): number {
    return this.#state?.generation ?? 0;
  }

  /** The last loaded state, fresh or not: only for advisory work (preparing logins ahead). */
  get latest(): CatalogState | null {
    return this.#state;
  }

  /** The state if it is confirmed fresh, without any I/O; otherwise undefined. */
  freshState(): CatalogState | undefined {
    if (!this.#fresh || this.#state === null || !this.#alive()) return undefined;
    return this.#state;
  }

  /**
   * A state no older than the catalog at the time of the call.
   * @throws {RoleResolutionFailedError} when Postgres cannot be read (fail closed).
   */
  async current(): Promise<CatalogState> {
    const fresh = this.freshState();
    if (fresh !== undefined) return fresh;
    try {
      // A reload that started after the latest notification is new enough.
      if (this.#loading !== null && this.#loading.epoch === this.#epoch) {
        return await this.#loading.promise;
      }
      return await this.#confirm();
    } catch (err) {
      throw new RoleResolutionFailedError('could not read the data-table catalog', { cause: err });
    }
  }

  /**
   * This process committed a catalog change at `generation`: until a state that new is loaded,
   * nothing is served from memory. Without it, the process that made a change could serve its
   * next run on the old state (and old cache key) until its own NOTIFY came back.
   */
  invalidate(generation: number): void {
    if (this.#closed || this.generation >= generation) return;
    this.#fresh = false;
    this.#epoch++;
  }

  /**
   * Resolves once a state at `generation` or newer is loaded (for tools and tests); rejects if
   * the snapshot is closed first, rather than waiting forever.
   */
  async waitForGeneration(generation: number): Promise<void> {
    if (this.generation >= generation) return;
    if (this.#closed) throw new Error('the data-table catalog is closed');
    await new Promise<void>((resolve, reject) => {
      const done = () => {
        this.#events.off('catalog:refreshed', onRefresh);
        this.#closeWaiters.delete(onClose);
      };
      const onRefresh = (event: { generation: number }) => {
        if (event.generation < generation) return;
        done();
        resolve();
      };
      const onClose = () => {
        done();
        reject(new Error('the data-table catalog was closed while waiting for a generation'));
      };
      this.#events.on('catalog:refreshed', onRefresh);
      this.#closeWaiters.add(onClose);
    });
  }

  /**
   * Stops the listener and the heartbeat, and resolves once no read of this snapshot is under
   * way (or after `CLOSE_WAIT_MS`, when one hangs): a generation check or reload started by a
   * notification (the process's own, after an admin change) finishes before the caller ends the
   * pool, and none starts after this.
   */
  async close(): Promise<void> {
    this.#closed = true;
    for (const onClose of [...this.#closeWaiters]) onClose();
    this.#fresh = false;
    clearTimeout(this.#reconnectTimer);
    clearInterval(this.#heartbeatTimer);
    const listener = this.#listener;
    this.#listener = null;
    if (listener !== null) await endClient(listener);
    // A check scheduled but not started sees #closed and reads nothing; one under way settles
    // (or, hung on a dead peer, is left to fail quietly on the ended pool).
    await this.#pendingConfirm?.catch(() => {});
    await settleWithin(this.#reads, CLOSE_WAIT_MS);
  }

  /** Runs a read on the pool, unless closed; close() waits for every read so started. */
  #read<T>(read: () => Promise<T>): Promise<T> {
    if (this.#closed) return Promise.reject(new Error('the data-table catalog is closed'));
    const promise = read();
    this.#reads.add(promise);
    const forget = () => this.#reads.delete(promise);
    promise.then(forget, forget);
    return promise;
  }

  #alive(): boolean {
    return performance.now() - this.#aliveAt <= this.stalenessBoundMs;
  }

  /**
   * Reads the generation with one query — shared by every caller that arrives before it starts,
   * so a burst of runs (or of forged notifications) costs one read — and reloads if it moved.
   */
  #confirm(): Promise<CatalogState> {
    if (this.#pendingConfirm !== null) return this.#pendingConfirm;
    const pending = new Promise<void>((resolve) => setImmediate(resolve)).then(() => {
      this.#pendingConfirm = null;
      return this.#confirmNow();
    });
    this.#pendingConfirm = pending;
    return pending;
  }

  async #confirmNow(): Promise<CatalogState> {
    const epoch = this.#epoch;
    const { rows } = await this.#read(() =>
      this.#pool.query<{ value: string }>({
        name: 'viewer_cache_generation',
        text: sql.READ_GENERATION,
      }),
    );
    const state = this.#state;
    if (state !== null && Number(rows[0]?.value) === state.generation) {
      // Every catalog change bumps the generation: equal means nothing changed since the read.
      if (epoch === this.#epoch && this.#listener !== null && !this.#closed) this.#fresh = true;
      return state;
    }
    // Moved: only a load that starts now is new enough, so do not join one in flight.
    this.#epoch++;
    return this.#reload();
  }

  /** Loads the catalog, joining a load that started after the latest notification. */
  #reload(): Promise<CatalogState> {
    if (this.#loading !== null && this.#loading.epoch === this.#epoch) return this.#loading.promise;
    const epoch = this.#epoch;
    const promise = this.#read(() => loadCatalogState(this.#pool)).then(
      (state) => {
        if (this.#loading?.promise === promise) this.#loading = null;
        if (this.#state === null || state.generation >= this.#state.generation) this.#state = state;
        // Fresh only if nothing was announced (and the listener did not drop) while loading.
        this.#fresh = this.#listener !== null && epoch === this.#epoch && !this.#closed;
        this.#events.emit('catalog:refreshed', { generation: state.generation });
        if (!this.#fresh && this.#listener !== null && !this.#closed) {
          void this.#reload().catch(() => {});
        }
        return this.#state;
      },
      (err: unknown) => {
        if (this.#loading?.promise === promise) this.#loading = null;
        throw err;
      },
    );
    this.#loading = { epoch, promise };
    return promise;
  }

  /** Proves the listener alive by reading the generation through it, within a timeout. */
  async #heartbeat(): Promise<void> {
    const client = this.#listener;
    if (client === null || this.#heartbeatRunning || this.#closed) return;
    this.#heartbeatRunning = true;
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    try {
      // In turn with the acknowledgements sent on this same connection.
      const answer = queryInTurn<{ value: string }>(client, sql.READ_GENERATION);
      const timeout = new Promise<never>((_, reject) => {
        timer = setTimeout(
          () => reject(new Error('catalog listener heartbeat timed out')),
          this.#heartbeatTimeoutMs,
        );
      });
      const { rows } = await Promise.race([answer, timeout]);
      if (this.#listener !== client) return;
      this.#aliveAt = started;
      const generation = Number(rows[0]?.value);
      if (this.#state !== null && generation > this.#state.generation && this.#loading === null) {
        // A notification that never arrived: stale from now, reload. (A load already under way
        // is checked again by the next heartbeat.)
        this.#fresh = false;
        this.#epoch++;
        void this.#reload().catch(() => {});
      }
    } catch (err) {
      this.#lost(client, (err as Error).message);
    } finally {
      clearTimeout(timer);
      this.#heartbeatRunning = false;
    }
  }

  #lost(client: pg.Client, reason: string): void {
    if (this.#listener !== client) return;
    this.#listener = null;
    this.#aliveAt = Number.NEGATIVE_INFINITY;
    this.#fresh = false;
    this.#epoch++;
    void this.#acks.attach(null);
    this.#events.emit('catalog:listener', { up: false });
    this.#logger.warn(
      { reason },
      'catalog listener lost; reading Postgres directly until it is back',
    );
    void endClient(client);
    this.#scheduleReconnect();
  }

  async #listen(): Promise<void> {
    const client = new pg.Client({
      ...this.#listenConfig,
      // Named, so an operator (or a test) can find each process's one LISTEN backend.
      application_name: this.#listenConfig.application_name ?? 'viewer-cache-listener',
    });
    client.on('error', (err) => this.#lost(client, err.message));
    client.on('end', () => this.#lost(client, 'connection ended'));
    client.on('notification', (message) => {
      if (this.#listener !== client) return;
      const announced = Number(message.payload);
      if (message.channel === ACK_CHANNEL) {
        this.#acks.received(message.processId, message.payload ?? '');
        return;
      }
      if (message.channel !== CATALOG_CHANNEL) {
        if (Object.hasOwn(this.#channels, message.channel))
          this.#channels[message.channel]?.(message.payload ?? '');
        return;
      }
      // Any role may NOTIFY this channel. A generation not newer than ours announces nothing.
      const held = this.#state?.generation;
      if (held !== undefined && Number.isSafeInteger(announced) && announced <= held) {
        this.#acks.acknowledge(client, announced);
        return;
      }
      // Stale from this instant: callers wait for a read that starts after it.
      this.#fresh = false;
      this.#epoch++;
      void this.#confirm().then(
        (state) => {
          // Acknowledged once read again, and never past the generation read: anyone may
          // NOTIFY a number (a forged 10^9), which must not be echoed, under our MAC, as one
          // this process has seen — it would end a later change's wait early.
          if (Number.isSafeInteger(announced) && this.#listener === client)
            this.#acks.acknowledge(client, Math.min(announced, state.generation));
        },
        (err: unknown) => {
          // Closing meanwhile is no failure: nobody will read this snapshot again.
          if (!this.#closed)
            this.#logger.warn({ err: (err as Error).message }, 'catalog reload failed');
        },
      );
    });
    const started = performance.now();
    try {
      await client.connect();
      await queryInTurn(client, `listen ${CATALOG_CHANNEL}`);
      for (const channel of Object.keys(this.#channels))
        await queryInTurn(client, `listen ${channel}`);
      await this.#acks.attach(client);
    } catch (err) {
      await endClient(client);
      throw err;
    }
    if (this.#closed) {
      await endClient(client);
      return;
    }
    this.#listener = client;
    this.#aliveAt = started;
    // Changes made while we were not listening are unknown: the next read confirms.
    this.#epoch++;
    this.#fresh = false;
    this.#reconnectDelayMs = this.#baseDelayMs;
    this.#events.emit('catalog:listener', { up: true });
  }

  #scheduleReconnect(): void {
    if (this.#closed) return;
    clearTimeout(this.#reconnectTimer);
    this.#reconnectTimer = setTimeout(() => {
      this.#listen()
        .then(() => this.#reload())
        .catch(() => {
          this.#reconnectDelayMs = Math.min(this.#reconnectDelayMs * 2, 5000);
          this.#scheduleReconnect();
        });
    }, this.#reconnectDelayMs);
    this.#reconnectTimer.unref();
  }
}

/**
 * Ends a client without waiting on a peer that may never answer: a half-open socket would keep
 * `end()` pending forever, so the socket is destroyed first.
 */
async function endClient(client: pg.Client): Promise<void> {
  const stream = (client as unknown as { connection?: { stream?: { destroy(): void } } }).connection
    ?.stream;
  stream?.destroy();
  await client.end().catch(() => {});
}
