import pg from 'pg';
import { RoleResolutionFailedError } from '../errors.js';
import type { TypedEmitter } from '../events.js';
import { type Logger, silentLogger } from '../logger.js';
import { type CatalogState, loadCatalogState } from './catalog_state.js';
import type { DatatablesEvents } from './datatables_events.js';
import { CATALOG_CHANNEL } from './migrations.js';
import * as sql from './sql/catalog_reads.js';

export interface CatalogSnapshotOptions {
  /** Pool on the catalog database (reads). */
  pool: pg.Pool;
  /** Connection for the dedicated LISTEN client. */
  listenConnection: pg.ClientConfig;
  /** Where `catalog:refreshed` and `catalog:listener` are emitted. */
  events: TypedEmitter<DatatablesEvents>;
  logger?: Logger;
  /** Delay before reconnecting a lost listener; doubles up to 5 s. @default 100 */
  reconnectDelayMs?: number;
}

/**
 * The catalog, kept in process and fresh through LISTEN/NOTIFY: every catalog change bumps the
 * generation and notifies in the same transaction.
 *
 * Freshness rule (SPEC invariant 10): the in-memory state is served without a round trip only
 * while the listener is connected and no notification has arrived since the state was read.
 * After a notification, callers wait for a reload that started after it. While the listener is
 * down, every read asks Postgres for the generation first and reloads when it moved — slower,
 * never stale.
 */
export class CatalogSnapshot {
  readonly #events: TypedEmitter<DatatablesEvents>;
  readonly #pool: pg.Pool;
  readonly #listenConfig: pg.ClientConfig;
  readonly #logger: Logger;
  readonly #baseDelayMs: number;
  #state: CatalogState | null = null;
  #listener: pg.Client | null = null;
  #listenerUp = false;
  /** Bumped on every notification and listener loss; a load is fresh only if it did not move. */
  #epoch = 0;
  #fresh = false;
  #loading: { epoch: number; promise: Promise<CatalogState> } | null = null;
  #reconnectTimer: NodeJS.Timeout | undefined;
  #reconnectDelayMs: number;
  #closed = false;

  constructor(options: CatalogSnapshotOptions) {
    this.#pool = options.pool;
    this.#events = options.events;
    this.#listenConfig = options.listenConnection;
    this.#logger = options.logger ?? silentLogger;
    this.#baseDelayMs = options.reconnectDelayMs ?? 100;
    this.#reconnectDelayMs = this.#baseDelayMs;
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
  }

  get listenerUp(): boolean {
    return this.#listenerUp;
  }

  /** The last loaded generation (0 before the first load). */
  get generation(): number {
    return this.#state?.generation ?? 0;
  }

  /** The state if it is confirmed fresh, without any I/O; otherwise undefined. */
  freshState(): CatalogState | undefined {
    return this.#fresh ? (this.#state ?? undefined) : undefined;
  }

  /**
   * A state no older than the catalog at the time of the call.
   * @throws {RoleResolutionFailedError} when Postgres cannot be read (fail closed).
   */
  async current(): Promise<CatalogState> {
    const fresh = this.freshState();
    if (fresh !== undefined) return fresh;
    try {
      if (!this.#listenerUp) {
        // No listener: confirm the generation with one tiny query before trusting memory. Every
        // catalog change bumps it, so an equal generation means nothing changed since the read.
        const { rows } = await this.#pool.query<{ value: string }>(sql.READ_GENERATION);
        if (this.#state !== null && Number(rows[0]?.value) === this.#state.generation) {
          return this.#state;
        }
        // Moved: only a load that starts now is new enough, so do not join one in flight.
        this.#epoch++;
      }
      return await this.#reload();
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

  /** Resolves once a state at `generation` or newer is loaded (for tools and tests). */
  async waitForGeneration(generation: number): Promise<void> {
    if (this.generation >= generation) return;
    await new Promise<void>((resolve) => {
      const onRefresh = (event: { generation: number }) => {
        if (event.generation < generation) return;
        this.#events.off('catalog:refreshed', onRefresh);
        resolve();
      };
      this.#events.on('catalog:refreshed', onRefresh);
    });
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#fresh = false;
    clearTimeout(this.#reconnectTimer);
    const listener = this.#listener;
    this.#listener = null;
    await listener?.end().catch(() => {});
    await this.#loading?.promise.catch(() => {});
  }

  /** Loads the catalog, joining a load that started after the latest notification. */
  #reload(): Promise<CatalogState> {
    if (this.#loading !== null && this.#loading.epoch === this.#epoch) return this.#loading.promise;
    const epoch = this.#epoch;
    const promise = loadCatalogState(this.#pool).then(
      (state) => {
        if (this.#loading?.promise === promise) this.#loading = null;
        if (this.#state === null || state.generation >= this.#state.generation) this.#state = state;
        // Fresh only if nothing was announced (and the listener did not drop) while loading.
        this.#fresh = this.#listenerUp && epoch === this.#epoch && !this.#closed;
        this.#events.emit('catalog:refreshed', { generation: state.generation });
        if (!this.#fresh && this.#listenerUp && !this.#closed) void this.#reload().catch(() => {});
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

  async #listen(): Promise<void> {
    const client = new pg.Client({
      ...this.#listenConfig,
      application_name: 'viewer-cache-listener',
    });
    const lost = (reason: string) => {
      if (this.#listener !== client) return;
      this.#listener = null;
      this.#listenerUp = false;
      this.#fresh = false;
      this.#epoch++;
      this.#events.emit('catalog:listener', { up: false });
      this.#logger.warn(
        { reason },
        'catalog listener lost; reading Postgres directly until it is back',
      );
      client.end().catch(() => {});
      this.#scheduleReconnect();
    };
    client.on('error', (err) => lost(err.message));
    client.on('end', () => lost('connection ended'));
    client.on('notification', (message) => {
      if (message.channel !== CATALOG_CHANNEL || this.#listener !== client) return;
      // Stale from this instant: callers wait for a reload that starts after it.
      this.#fresh = false;
      this.#epoch++;
      void this.#reload().catch((err: unknown) => {
        this.#logger.warn({ err: (err as Error).message }, 'catalog reload failed');
      });
    });
    await client.connect();
    await client.query(`listen ${CATALOG_CHANNEL}`);
    if (this.#closed) {
      await client.end();
      return;
    }
    this.#listener = client;
    this.#listenerUp = true;
    // Changes made while we were not listening are unknown: the next read reloads.
    this.#epoch++;
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
