/*
 * datatable/identity/ — the viewer inside Postgres (SPEC invariant 13): installing the identity
 * functions and keeping each connection's lease epoch (this file), the SQL they are made of
 * (sql/identity.ts), and binding a run's viewer to the connection lent to it
 * (viewer_binding.ts), the one place a lease and the identities meet.
 */
import { hash, randomBytes } from 'node:crypto';
import pg from 'pg';
import { type Logger, silentLogger } from '../../logger.js';
import type { LeadStatement } from '../../pg/lead_query.js';
import { GuardedClient, withPooledClient } from '../../pg/pg_clients.js';
import { isMissingObject } from '../../pg/sqlstate.js';
import { withTransaction } from '../../pg/transaction.js';
import { SingleFlight } from '../../util/single_flight.js';
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
 * functions and a binding key in each data-table database, keeps the lease epoch of each
 * pooled connection, and signs the statement a lent connection runs to bind its viewer. One
 * small admin pool per data-table database, used only to install.
 */
export class ViewerIdentities {
  readonly #adminConfig: pg.ClientConfig;
  readonly #logger: Logger;
  readonly #pools = new Map<string, pg.Pool>();
  readonly #installed = new Set<string>();
  /** Each database's binding key, as its two HMAC pads. */
  readonly #keys = new Map<string, Key>();
  /** The epoch each pooled connection of this process runs in (by its pg client). */
  readonly #epochs = new WeakMap<object, string>();
  readonly #installing = new SingleFlight<void>();
  readonly #rechecked = new Map<string, number>();
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
          const { rows } = await withTransaction(client, async () => {
            // Concurrent installs (several processes starting) would collide on CREATE OR REPLACE.
            await client.query("select pg_advisory_xact_lock(hashtext('viewer_cache.identity'))");
            if (!(await installedAlready(client))) {
              for (const statement of sql.INSTALL) await client.query(statement);
              for (const statement of sql.RECORD_INSTALLED) await client.query(statement);
              const { rows } = await client.query<{ state: string }>(sql.INSTALLED_STATE);
              await client.query(sql.STORE_INSTALLED, [INSTALL_TEXT, rows[0]!.state]);
            }
            // A random key of this database's own, unless another process stored one first.
            const key = randomBytes(64);
            await client.query(sql.STORE_KEY, [xorWith(key, 0x36), xorWith(key, 0x5c)]);
            return client.query<{ inner_pad: Buffer; outer_pad: Buffer }>(sql.READ_KEY);
          });
          this.#keys.set(database, { inner: rows[0]!.inner_pad, outer: rows[0]!.outer_pad });
        });
        this.#installed.add(database);
      })
    );
  }

  /**
   * The statement a viewer lease sends in front of its first statement: the binding, signed
   * for the backend and for `connection`'s current epoch. Null until `install(database)` has
   * read the database's key, or while the connection's epoch is unknown (see ready).
   */
  bindingFor(
    database: string,
    connection: object,
    socket: BackendSocket,
    identity: ViewerIdentity,
  ): LeadStatement | null {
    const key = this.#keys.get(database);
    const epoch = this.#epochs.get(connection);
    if (key === undefined || epoch === undefined) return null;
    const email = identity.email === null ? '-' : `=${identity.email}`;
    const attributes = JSON.stringify(identity.attributes);
    // The same message the reading functions build from the settings and the calling backend.
    const mac = hmac(key, [
      'viewer',
      socket.pid,
      socket.clientPort ?? '',
      epoch,
      Buffer.byteLength(email, 'utf8'),
      email,
      attributes,
    ]);
    return { text: sql.BIND, values: [email, attributes, mac.toString('hex')] };
  }

  /**
   * Through a transaction pooler: the statement sent in front of each transaction of a viewer's
   * run (sql.BIND_TRANSACTION), with the viewer signed under the database's key for
   * `TRANSACTION_TOKEN_MS` from now; Postgres turns it into a binding of that transaction only.
   * Null until `install(database)` has read the key.
   */
  transactionBindingFor(database: string, identity: ViewerIdentity): LeadStatement | null {
    const key = this.#keys.get(database);
    if (key === undefined) return null;
    const email = identity.email === null ? '-' : `=${identity.email}`;
    const attributes = JSON.stringify(identity.attributes);
    const expires = String(Date.now() + TRANSACTION_TOKEN_MS);
    const mac = hmac(key, ['lease', expires, Buffer.byteLength(email, 'utf8'), email, attributes]);
    return {
      text: sql.BIND_TRANSACTION,
      values: [email, attributes, expires, mac.toString('hex')],
    };
  }

  /**
   * The identity schema of `database` is not what this process installed (a statement found a
   * function, sequence or schema missing: dropped or restored behind it). The next viewer lease
   * installs it again and reads the key anew.
   */
  forgetIfMissing(database: string, err: unknown): void {
    if (!isMissingObject(err)) return;
    this.#installed.delete(database);
    this.#keys.delete(database);
  }

  /** Whether this process has installed (and read the key of) `database`. */
  installed(database: string): boolean {
    return this.#keys.has(database);
  }

  /** Whether `install(database)` has read the key, and `connection`'s epoch is known. */
  ready(database: string, connection: object): boolean {
    return this.#keys.has(database) && this.#epochs.has(connection);
  }

  /** Records the epoch `next_lease()` returned on `connection` (a bigint, as pg returns it). */
  entered(connection: object, epoch: string | number): void {
    this.#epochs.set(connection, String(epoch));
  }

  /** `connection`'s session was reset without drawing an epoch: it has none now. */
  left(connection: object): void {
    this.#epochs.delete(connection);
  }

  /**
   * A viewer's run was refused its identity although its binding went out: a runnable that
   * tampered with it, or a key changed behind this process (restored, reinstalled). Reads the
   * key again, at most once per `RECHECK_MS` per database, so the second heals itself.
   */
  recheck(database: string): void {
    const now = performance.now();
    const last = this.#rechecked.get(database);
    if (last !== undefined && now - last < RECHECK_MS) return;
    if (this.#closed) return;
    this.#rechecked.set(database, now);
    void this.#pool(database)
      .query<{ inner_pad: Buffer; outer_pad: Buffer }>(sql.READ_KEY)
      .then(({ rows }) => {
        const row = rows[0];
        if (row !== undefined)
          this.#keys.set(database, { inner: row.inner_pad, outer: row.outer_pad });
      })
      .catch((err: unknown) => {
        this.#logger.warn({ err: (err as Error).message }, 'could not read the binding key again');
      });
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
        // Always listening: a connection that dies while lent (its database dropped under it)
        // must not be an unhandled 'error'; the statement running on it fails on its own.
        Client: GuardedClient,
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

/**
 * How long a signed transaction binding may be turned into one (it is signed afresh for every
 * transaction): room for clock skew between this process and Postgres, little for a replay.
 */
const TRANSACTION_TOKEN_MS = 5 * 60_000;

/** How often at most a refused identity makes this process read a database's key again. */
const RECHECK_MS = 5_000;

type Key = { inner: Buffer; outer: Buffer };

/** HMAC-SHA-256 from the key's two pads, over the fields joined by newlines (as SQL's concat_ws). */
function hmac(key: Key, fields: readonly (string | number)[]): Buffer {
  // One-shot hashes: a Hash object per step cost more than the hashing itself.
  const message = Buffer.from(fields.join('\n'), 'utf8');
  const inner = hash('sha256', Buffer.concat([key.inner, message]), 'buffer');
  return hash('sha256', Buffer.concat([key.outer, inner]), 'buffer');
}

function xorWith(key: Buffer, pad: number): Buffer {
  const out = Buffer.allocUnsafe(key.length);
  for (let i = 0; i < key.length; i++) out[i] = key[i]! ^ pad;
  return out;
}

const INSTALL_TEXT = sql.INSTALL.join(';\n');

/**
 * Whether INSTALL ran here before, unchanged, and left everything as it made it: then running
 * it again would change nothing but fire the database's rule-change trigger.
 */
async function installedAlready(client: pg.PoolClient): Promise<boolean> {
  const found = await client.query<{ recorded: boolean }>(sql.INSTALL_RECORDED);
  if (found.rows[0]?.recorded !== true) return false;
  const row = (await client.query<{ install: string; state: string }>(sql.READ_INSTALLED)).rows[0];
  if (row === undefined || row.install !== INSTALL_TEXT) return false;
  const { state } = row;
  const now = (await client.query<{ state: string }>(sql.INSTALLED_STATE)).rows[0]?.state;
  return now === state;
}
