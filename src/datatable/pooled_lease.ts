import type pg from 'pg';
import type {
  DatatableClient,
  DatatableLease,
  DatatableQueryResult,
} from '../connector/datatable_connector.js';
import {
  ConnectionLostError,
  InvalidDataError,
  NoViewerAttributeError,
  NoViewerError,
} from '../errors.js';
import type { Logger } from '../logger.js';
import { isConnectionLost } from './pg_clients.js';
import { NO_ATTRIBUTE, NO_EMAIL, NO_IDENTITY } from './sql/identity.js';

/**
 * A pooled connection lent to one job. The runnable only ever sees {@link DatatableClient}.
 *
 * The lease listens for `'error'` on its client from checkout until the client is back in the
 * pool or destroyed: a backend terminated mid-job (a retired login, an operator, a restart)
 * fails that job with `E_CONNECTION_LOST` instead of crashing the process, and the broken
 * client is destroyed, never pooled.
 */
export class PooledLease implements DatatableLease {
  #client: pg.PoolClient | null;
  #broken: Error | null = null;
  readonly #logger: Logger;
  readonly #onError = (err: Error) => {
    this.#broken ??= err;
  };
  readonly #login: string;
  /** The statements that reset the connection before it goes back: DISCARD ALL, or more. */
  #reset: readonly string[] = ['discard all'];
  /** Runs if the connection is destroyed instead (best effort). */
  #onDestroy: (() => Promise<void>) | null = null;
  readonly #onReleased: (lease: PooledLease, login: string) => void;
  readonly #shed: () => boolean;
  readonly client: DatatableClient;

  constructor(
    client: pg.PoolClient,
    login: string,
    logger: Logger,
    onReleased: (lease: PooledLease, login: string) => void,
    /** Whether a clean connection should be closed instead of pooled (others wait for room). */
    shed: () => boolean = () => false,
  ) {
    this.#shed = shed;
    this.#client = client;
    this.#login = login;
    this.#logger = logger;
    this.#onReleased = onReleased;
    client.on('error', this.#onError);
    // A frozen facade with no data properties: no credentials, no pool, no way to reconnect,
    // and `JSON.stringify` of it is `{}` should a runnable return it.
    this.client = Object.freeze({
      query: <Row = Record<string, unknown>>(text: string, values?: readonly unknown[]) =>
        this.query(text, values) as Promise<DatatableQueryResult<Row>>,
    });
  }

  /** Which backend this is: pid and client socket, to bind an identity to exactly it. */
  get backend(): { pid: number; clientAddress: string | null; clientPort: number | null } {
    const client = this.#client as unknown as {
      processID?: number;
      connection?: { stream?: { localAddress?: string; localPort?: number } };
    } | null;
    const stream = client?.connection?.stream;
    return {
      pid: client?.processID ?? 0,
      clientAddress: stream?.localAddress ?? null,
      clientPort: stream?.localPort ?? null,
    };
  }

  /**
   * Replaces the reset run before the connection may be pooled again (it must succeed, or the
   * connection is destroyed), and what to do when it is destroyed instead.
   */
  resetWith(statements: readonly string[], onDestroy: () => Promise<void>): void {
    this.#reset = statements;
    this.#onDestroy = onDestroy;
  }

  async query(text: string, values?: readonly unknown[]): Promise<DatatableQueryResult> {
    const client = this.#client;
    if (client === null)
      throw new Error('this data-table connection was released when its job ended');
    if (this.#broken !== null) throw new ConnectionLostError(undefined, { cause: this.#broken });
    try {
      const result = await client.query(
        values === undefined ? text : { text, values: [...values] },
      );
      return { rows: result.rows, rowCount: result.rowCount };
    } catch (err) {
      if (isConnectionLost(err)) {
        this.#broken ??= err as Error;
        throw new ConnectionLostError(undefined, { cause: err });
      }
      // Class 22 (data exception: a NUL byte, bad encoding, out-of-range value…) is the
      // request's fault, not the server's: a coded 4xx instead of a runnable failure.
      const code = (err as { code?: unknown }).code;
      if (code === NO_IDENTITY) {
        throw new NoViewerError(
          'this connection carries no viewer identity: only a run with a viewer, connected with ?as=viewer, has one',
          { cause: err },
        );
      }
      if (code === NO_EMAIL) {
        throw new NoViewerError(
          'this viewer has no email: an embed viewer has one only when its host signed one',
          { cause: err },
        );
      }
      if (code === NO_ATTRIBUTE) {
        throw new NoViewerAttributeError(undefined, { cause: err });
      }
      if (typeof code === 'string' && code.startsWith('22')) {
        // Postgres's message can quote the value (an email, an arg): only the SQLSTATE goes in
        // ours; the original stays in `cause` for whoever chooses to look.
        throw new InvalidDataError(
          `the database refused a value in this request (SQLSTATE ${code})`,
          {
            cause: err,
          },
        );
      }
      throw err;
    }
  }

  /**
   * Returns the connection: reset (`DISCARD ALL`) and pooled, or destroyed when `destroy` is
   * true (a job that timed out mid-query), the connection broke, or the reset fails.
   */
  async release(destroy: boolean): Promise<void> {
    const client = this.#client;
    if (client === null) return;
    this.#client = null;
    if (destroy || this.#broken !== null) {
      // Best effort: a destroyed backend's binding matches nothing anyway (see sql/identity.ts).
      this.#onDestroy?.().catch(() => {});
      this.#finish(client, this.#broken ?? true);
      return;
    }
    // Not awaited: the job's result need not wait for the reset; the connection is simply not
    // back in the pool until it is clean (and unbound). The error listener stays on until then.
    // Queued back to back on the connection (pg runs them in order); all must succeed.
    Promise.all(this.#reset.map((statement) => client.query(statement))).then(
      () => this.#finish(client, this.#broken ?? this.#shed()),
      (err: unknown) => {
        this.#logger.debug({ err: (err as Error).message }, 'connection reset failed; closing it');
        this.#onDestroy?.().catch(() => {});
        this.#finish(client, true);
      },
    );
  }

  /** Destroys the connection now (the pools are closing); a query in flight fails. */
  abandon(): void {
    const client = this.#client;
    if (client === null) return;
    this.#client = null;
    this.#broken ??= new Error('data-table pools closed');
    this.#finish(client, true);
  }

  #finish(client: pg.PoolClient, destroy: Error | boolean): void {
    // A late 'error' after release is not unhandled either: the pools' clients are
    // GuardedClients, which always listen (adding a no-op here on every release leaked one
    // listener per reuse).
    client.off('error', this.#onError);
    client.release(destroy);
    this.#onReleased(this, this.#login);
  }
}
