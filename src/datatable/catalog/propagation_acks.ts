import { createHmac, timingSafeEqual } from 'node:crypto';
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
 * memory and read the generation again, never a generation past the one it read (a number
 * anyone NOTIFYs is not echoed). A process that made a change and wants it
 * propagated LISTENs there before committing and waits, after the commit, for an
 * acknowledgement from every holder — at most the staleness bound (heartbeat + timeout), after
 * which a listener that said nothing has stopped trusting its memory anyway.
 *
 * Acknowledgements are authenticated: each carries an HMAC, under a key derived from the
 * deployment's secret, over the sender's backend pid and the generation, so only a process
 * holding the secret can acknowledge, only for its own backend (Postgres says which one sent a
 * notification) and only the generation it names. Anyone who can connect may NOTIFY the
 * channel or take the listener lock, but what they send without the key is ignored: a session
 * that joins the lock and acknowledges is waited for (to the bound) like a silent process,
 * never counted, so a forged acknowledgement cannot make a change return early.
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
  readonly #key: Uint8Array;
  #client: pg.Client | null = null;
  #ownPid = 0;
  #listening: Promise<unknown> | null = null;
  readonly #watchers = new Set<Watcher>();
  /** The newest generation to acknowledge once the acknowledgement in flight is done. */
  #ackNext: number | null = null;
  #ackInFlight = false;

  /** @param key derived from the deployment's secret for this use alone */
  constructor(pool: pg.Pool, boundMs: number, key: Uint8Array) {
    this.#pool = pool;
    this.#boundMs = boundMs;
    this.#key = key;
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

  /**
   * An acknowledgement arrived on the listener: `pid` is the backend Postgres says sent it.
   * Counted only when its MAC verifies for that backend and generation.
   */
  received(pid: number, payload: string): void {
    if (this.#watchers.size === 0) return;
    const match = /^(\d{1,15}) ([A-Za-z0-9_-]{43})$/.exec(payload);
    if (match === null) return;
    const generation = Number(match[1]);
    const mac = Buffer.from(match[2] as string, 'base64url');
    const expected = ackMac(this.#key, pid, generation);
    if (mac.length !== expected.length || !timingSafeEqual(mac, expected)) return;
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
    // The backend that will send it (pg sets processID on connecting; not in its types).
    const pid = (client as { processID?: number | null }).processID ?? this.#ownPid;
    const mac = ackMac(this.#key, pid, generation).toString('base64url');
    queryInTurn(client, {
      text: 'select pg_notify($1, $2)',
      values: [ACK_CHANNEL, `${generation} ${mac}`],
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

/** The MAC of an acknowledgement: bound to the sending backend and the generation. */
function ackMac(key: Uint8Array, pid: number, generation: number): Buffer {
  return createHmac('sha256', key)
    .update(`viewer-cache propagation ack v1\0${pid}\0${generation}`)
    .digest();
}
