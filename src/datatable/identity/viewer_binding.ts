import { ConnectFailedError, ConnectionLostError } from '../../errors.js';
import type { JobPerms } from '../../job.js';
import { isConnectionLost, NO_IDENTITY, sqlstateOf } from '../../pg/sqlstate.js';
import { type PooledLease, RESET_SESSION } from '../logins/pooled_lease.js';
import { NEXT_LEASE } from './sql/identity.js';
import type { ViewerIdentities, ViewerIdentity } from './viewer_identity.js';

/**
 * Binds a run's viewer to the connection lent to it: the one place a lease and the viewer
 * identities meet. The front door hands it a lease and a viewer and gets the lease back, bound;
 * everything it asks of the lease and of {@link ViewerIdentities} happens here.
 */
export class ViewerBinding {
  readonly #identities: ViewerIdentities;
  /** Login connections go through a transaction pooler: bind each transaction, not the lease. */
  readonly #perTransaction: boolean;

  constructor(identities: ViewerIdentities, options: { perTransaction?: boolean } = {}) {
    this.#identities = identities;
    this.#perTransaction = options.perTransaction === true;
  }

  /**
   * `lease`, on `database`, bound to `viewer` (a `?as=viewer` connection): a bind that fails
   * releases the lease, destroyed, and rejects with a coded error. With `viewer` null (a named
   * or default role) the lease is only made to draw its next epoch on release, synchronously:
   * no promise hop on those leases.
   */
  bind(lease: PooledLease, database: string, viewer: ViewerIdentity): Promise<PooledLease>;
  bind(lease: PooledLease, database: string, viewer: null): PooledLease;
  bind(
    lease: PooledLease,
    database: string,
    viewer: ViewerIdentity | null,
  ): PooledLease | Promise<PooledLease> {
    if (this.#perTransaction) {
      // No epoch: the pooler resets each backend after every transaction, and a binding
      // outlives no transaction anyway (see sql/identity.ts, sign_transaction).
      return viewer === null ? lease : this.#bindEveryTransaction(lease, database, viewer);
    }
    this.#resetWithEpoch(lease, database);
    return viewer === null ? lease : this.#bind(lease, database, viewer);
  }

  /**
   * On a data-table with viewer identity, every lease's reset also draws the session's next
   * epoch (see sql/identity.ts), so any binding made during the lease is void once the
   * connection is back in its pool, and the next viewer lease knows the epoch to sign.
   */
  #resetWithEpoch(lease: PooledLease, database: string): void {
    const identities = this.#identities;
    const { connection } = lease;
    lease.resetWith(
      () =>
        identities.installed(database)
          ? {
              // One Query message: the reset, then the new epoch (its last result).
              statement: `${RESET_SESSION}; ${NEXT_LEASE}`,
              onDone: (result) => {
                const last = Array.isArray(result) ? result[result.length - 1]! : result;
                identities.entered(connection, last.rows[0]!.epoch);
              },
              onFailed: (err) => {
                identities.left(connection);
                identities.forgetIfMissing(database, err);
              },
            }
          : { statement: RESET_SESSION, onDone: () => identities.left(connection) },
      async () => identities.left(connection),
    );
  }

  /**
   * Through a transaction pooler, where each transaction may meet another backend: the viewer
   * is bound inside each of the run's transactions, from the lent connection, signed afresh
   * for each (see PooledLease.bindEveryTransaction). The first lease of a database in this
   * process installs it (and reads its key) first.
   */
  async #bindEveryTransaction(
    lease: PooledLease,
    database: string,
    identity: ViewerIdentity,
  ): Promise<PooledLease> {
    const identities = this.#identities;
    if (!identities.installed(database)) {
      try {
        await identities.install(database);
      } catch (err) {
        await lease.release(true);
        identities.forgetIfMissing(database, err);
        throw new ConnectFailedError('could not bind the viewer to the data-table connection', {
          cause: err,
        });
      }
    }
    lease.bindEveryTransaction(
      () => {
        const statement = identities.transactionBindingFor(database, identity);
        // The key forgotten meanwhile (the schema was dropped behind us): fail closed.
        if (statement === null) throw new ConnectFailedError('the viewer binding key is unknown');
        return [statement];
      },
      (err) => {
        identities.forgetIfMissing(database, err);
        // Refused by sign_transaction: the key changed behind this process (restored,
        // reinstalled); read it again, as a refused read does directly.
        if (sqlstateOf(err) === NO_IDENTITY) identities.recheck(database);
        return new ConnectFailedError('could not bind the viewer to the data-table connection', {
          cause: err,
        });
      },
      () => identities.recheck(database),
    );
    return lease;
  }

  /**
   * Binds the viewer to the lent backend, from that backend, in front of the run's first
   * statement (see PooledLease.bindBeforeFirstQuery). The first viewer lease of a connection
   * (or of a database in this process) first installs and draws an epoch: one round trip, once.
   */
  async #bind(
    lease: PooledLease,
    database: string,
    identity: ViewerIdentity,
  ): Promise<PooledLease> {
    const identities = this.#identities;
    const { connection } = lease;
    if (!identities.ready(database, connection)) {
      try {
        await identities.install(database);
        const { rows } = await lease.internalQuery(NEXT_LEASE);
        identities.entered(connection, rows[0]!.epoch);
      } catch (err) {
        await lease.release(true);
        identities.forgetIfMissing(database, err);
        if (isConnectionLost(err)) throw new ConnectionLostError(undefined, { cause: err });
        throw new ConnectFailedError('could not bind the viewer to the data-table connection', {
          cause: err,
        });
      }
    }
    const statement = identities.bindingFor(database, connection, lease.backend, identity)!;
    lease.bindBeforeFirstQuery(
      [statement],
      (err) =>
        new ConnectFailedError('could not bind the viewer to the data-table connection', {
          cause: err,
        }),
      () => identities.recheck(database),
    );
    return lease;
  }
}

/**
 * The viewer of a run as policies read it: a signed-in viewer's email, or an embed viewer's
 * (signed) email and attributes. Call only for a run that has a viewer (the grant refuses
 * `?as=viewer` otherwise).
 */
export function viewerIdentityOf(perms: JobPerms): ViewerIdentity {
  const { endUserEmail, embed } = perms;
  return endUserEmail !== null
    ? { email: endUserEmail, attributes: {} }
    : { email: embed!.email, attributes: embed!.attributes };
}
