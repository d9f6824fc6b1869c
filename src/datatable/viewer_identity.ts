import pg from 'pg';
import { type Logger, silentLogger } from '../logger.js';
import { SingleFlight } from '../util/single_flight.js';
import { withPooledClient } from './pg_clients.js';
import * as sql from './sql/identity.js';

/** What a policy can read about the viewer of a run. */
export interface ViewerIdentity {
  /** `null` for an embed viewer whose assertion carries no email: `viewer_email()` raises. */
  readonly email: string | null;
  /** Signed attributes (embed viewers); empty for a signed-in user. */
  readonly attributes: Readonly<Record<string, string>>;
}

/** Which backend a lent connection is: its pid, and its socket's local end (null on Unix sockets). */
export interface BackendSocket {
  readonly pid: number;
  readonly clientAddress: string | null;
  readonly clientPort: number | null;
}

/**
 * The privileged side of the viewer's identity in Postgres (see sql/identity.ts): installs the
 * functions in each data-table database, binds an identity to a lent backend, and unbinds it
 * before the connection goes back to its pool. One small admin pool per data-table database.
 */
export class ViewerIdentities {
  readonly #adminConfig: pg.ClientConfig;
  readonly #logger: Logger;
  readonly #pools = new Map<string, pg.Pool>();
  readonly #installed = new Set<string>();
  readonly #installing = new SingleFlight<void>();
  #closed = false;

  constructor(adminConfig: pg.ClientConfig, logger: Logger = silentLogger) {
    this.#adminConfig = adminConfig;
    this.#logger = logger;
  }

  /** Installs (idempotently) the identity schema and functions into `database`. */
  install(database: string): Promise<void> {
    if (this.#installed.has(database)) return Promise.resolve();
    return (
      this.#installing.get(database) ??
      this.#installing.run(database, async () => {
        await withPooledClient(this.#pool(database), async (client) => {
          await client.query('begin');
          try {
            // Concurrent installs (several processes starting) would collide on CREATE OR REPLACE.
            await client.query("select pg_advisory_xact_lock(hashtext('viewer_cache.identity'))");
            for (const statement of sql.INSTALL) await client.query(statement);
            await client.query('commit');
          } catch (err) {
            await client.query('rollback').catch(() => {});
            throw err;
          }
        });
        this.#installed.add(database);
      })
    );
  }

  /** Binds `identity` to the backend of `socket` (as the lent connection sees it). */
  async bind(database: string, socket: BackendSocket, identity: ViewerIdentity): Promise<void> {
    await this.install(database);
    // Named: prepared once per connection, not planned on every lease.
    const { rowCount } = await this.#pool(database).query({
      name: 'viewer_cache_bind',
      text: sql.BIND,
      values: [
        socket.pid,
        socket.clientAddress,
        socket.clientPort,
        identity.email,
        JSON.stringify(identity.attributes),
      ],
    });
    if (rowCount !== 1) throw new Error('the lent connection could not be bound to its viewer');
  }

  async unbind(database: string, pid: number): Promise<void> {
    await this.#pool(database).query(sql.UNBIND, [pid]);
  }

  async close(): Promise<void> {
    this.#closed = true;
    const pools = [...this.#pools.values()];
    this.#pools.clear();
    await Promise.allSettled(pools.map((pool) => pool.end()));
  }

  #pool(database: string): pg.Pool {
    if (this.#closed) throw new Error('viewer identities are closed');
    let pool = this.#pools.get(database);
    if (pool === undefined) {
      pool = new pg.Pool({
        ...this.#adminConfig,
        database,
        max: 2,
        idleTimeoutMillis: 30_000,
        allowExitOnIdle: true,
        application_name: 'viewer-cache-identity',
      });
      pool.on('error', (err) => {
        this.#logger.debug({ err: err.message }, 'identity connection closed');
      });
      this.#pools.set(database, pool);
    }
    return pool;
  }
}
