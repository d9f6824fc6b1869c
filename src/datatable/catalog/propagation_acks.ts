import type pg from 'pg';
import { queryInTurn } from '../../pg/pg_clients.js';

/**
 * "The change has reached every process" (`catalog.awaitPropagation`): without it, a run that
 * starts in another process a few milliseconds after a change returned can still be answered
 * from the state before it — its NOTIFY is on the way.
 *
 * Every process's listener, once LISTENing, holds a shared advisory lock, so the live listeners
 * are the lock's holders in `pg_locks` (a dead session's lock goes with it). Each listener
 * acknowledges every catalog notification on {@link ACK_CHANNEL} *after* it stopped trusting its
 * memory, so its next run confirms with Postgres. A process that made a change and wants it
 * propagated LISTENs there before committing and waits, after the commit, for an
 * acknowledgement from every holder — at most the staleness bound (heartbeat + timeout), after
 * which a listener that said nothing has stopped trusting its memory anyway.
 *
 * Acknowledgements are advisory: anyone who can connect may NOTIFY the channel and make a wait
 * end early — then the change is only as fast as it is without waiting, never less safe.
 */
export const ACK_CHANNEL = 'viewer_cache_catalog_ack';
/** Held shared by every live listener ('vclistnr' in ASCII). */
const LISTENER_LOCK = 0x76636c6973746e72n;
export const HOLD_LISTENER_LOCK = `select pg_backend_pid() as pid, pg_advisory_lock_shared(${LISTENER_LOCK})`;
const LISTENER_PIDS = `
  select pid from pg_catalog.pg_locks
   where locktype = 'advisory' and granted and objsubid = 1
     and database = (select oid from pg_catalog.pg_database where datname = current_database())
     and classid = ${LISTENER_LOCK >> 32n} and objid = ${LISTENER_LOCK & 0xffffffffn}`;

export interface PropagationWatch {
  /** Resolves once every other live listener acknowledged `generation`, or the bound passed. */
  wait(generation: number): Promise<{ acknowledged: number; missing: number }>;
  close(): void;
}

type Watcher = (pid: number, generation: number) => void;

export class PropagationAcks {
  readonly #pool: pg.Pool;
  readonly #boundMs: number;
  #client: pg.Client | null = null;
  #ownPid = 0;
  #listening: Promise<unknown> | null = null;
  readonly #watchers = new Set<Watcher>();
  /** The newest generation to acknowledge once the acknowledgement in flight is done. */
  #ackNext: number | null = null;
  #ackInFlight = false;

  constructor(pool: pg.Pool, boundMs: number) {
    this.#pool = pool;
    this.#boundMs = boundMs;
  }

  /** The listener is LISTENing (on a new connection, or none): take the lock, re-LISTEN acks. */
  async attach(client: pg.Client | null): Promise<void> {
    this.#client = client;
    this.#listening = null;
    if (client === null) return;
    const { rows } = await queryInTurn<{ pid: number }>(client, HOLD_LISTENER_LOCK);
    this.#ownPid = rows[0]!.pid;
    if (this.#watchers.size > 0) await this.#listen(client);
    this.#ackInFlight = false;
    this.#ackNext = null;
  }

  /** An acknowledgement arrived on the listener. */
  received(pid: number, generation: number): void {
    for (const watcher of this.#watchers) watcher(pid, generation);
  }

  /**
   * Acknowledges a catalog notification: call only once the memory is no longer trusted. One
   * acknowledgement in flight at a time, the newest generation next: a flood of notifications
   * (anyone may NOTIFY) costs each process one query at a time, not one per notification.
   */
  acknowledge(client: pg.Client, generation: number): void {
    if (this.#ackInFlight) {
      this.#ackNext = Math.max(this.#ackNext ?? 0, generation);
      return;
    }
    this.#ackInFlight = true;
    queryInTurn(client, {
      text: 'select pg_notify($1, $2)',
      values: [ACK_CHANNEL, String(generation)],
    }).then(
      () => {
        this.#ackInFlight = false;
        const next = this.#ackNext;
        this.#ackNext = null;
        if (next !== null && this.#client === client) this.acknowledge(client, next);
      },
      () => {
        // The listener is going away: it is reported lost elsewhere, and fails closed meanwhile.
        this.#ackInFlight = false;
      },
    );
  }

  /** Starts collecting acknowledgements (before the change commits); null without a listener. */
  async watch(): Promise<PropagationWatch | null> {
    const client = this.#client;
    if (client === null) return null;
    const seen = new Map<number, number>();
    let check = () => {};
    const watcher: Watcher = (pid, generation) => {
      if (generation > (seen.get(pid) ?? 0)) seen.set(pid, generation);
      check();
    };
    this.#watchers.add(watcher);
    const close = () => {
      if (!this.#watchers.delete(watcher) || this.#watchers.size > 0) return;
      if (this.#client === client) {
        this.#listening = null;
        void queryInTurn(client, `unlisten ${ACK_CHANNEL}`).catch(() => {});
      }
    };
    try {
      await this.#listen(client);
    } catch {
      close();
      return null;
    }
    return {
      close,
      wait: async (generation) => {
        const { rows } = await this.#pool.query<{ pid: number }>(LISTENER_PIDS);
        const others = rows.map((row) => row.pid).filter((pid) => pid !== this.#ownPid);
        const missing = () => others.filter((pid) => (seen.get(pid) ?? 0) < generation).length;
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, this.#boundMs);
          timer.unref();
          check = () => {
            if (missing() > 0) return;
            clearTimeout(timer);
            resolve();
          };
          check();
        });
        return { acknowledged: others.length - missing(), missing: missing() };
      },
    };
  }

  #listen(client: pg.Client): Promise<unknown> {
    this.#listening ??= queryInTurn(client, `listen ${ACK_CHANNEL}`);
    return this.#listening;
  }
}
