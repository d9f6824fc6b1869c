/*
 * pg/ — the floor beneath the data tables and the queue: Postgres plumbing that knows no table of
 * ours. The clients the library owns, each with an 'error' listener (this file); the SQLSTATEs
 * the layer branches on (sqlstate.ts); the lead query that sends the library's statements in
 * front of a run's first one (lead_query.ts); the socket that joins corked writes
 * (coalescing_socket.ts); the migration runner (migration_runner.ts). It imports no other room.
 */
import pg from 'pg';
import { isConnectionLost } from './sqlstate.js';

/**
 * Every pg client the library owns goes through here, so none is ever without an `'error'`
 * listener: pg-pool listens only while a client is idle, and a backend terminated while a client
 * is checked out (a retired login, `pg_terminate_backend`, a restart, a network drop) emits
 * `'error'` on it — with no listener, that is an uncaught exception that ends the process.
 */

/**
 * The client class of every pool the library owns: it listens for `'error'` from construction
 * to the end, so no instant exists where an error is unhandled. pg-pool drops its own listener
 * when it hands a client out, and resolves `connect()` from inside the parser loop: when the
 * backend is terminated right after authenticating (a login retired or repaired at that moment),
 * the FATAL message can be in the same chunk as ReadyForQuery and is emitted before the caller's
 * continuation could add a listener. The failure itself still reaches the caller: the pending or
 * next query rejects, and the lease or {@link withPooledClient} sees it.
 */
export class GuardedClient extends pg.Client {
  constructor(config?: string | pg.ClientConfig) {
    super(config);
    this.on('error', ignore);
  }
}

function ignore(): void {}

/**
 * Runs `fn` with a client of `pool`. A client whose connection failed while checked out is
 * destroyed rather than returned, and its `'error'` event is absorbed (the query that was
 * running rejects on its own).
 */
export async function withPooledClient<T>(
  pool: pg.Pool,
  fn: (client: pg.PoolClient) => Promise<T>,
): Promise<T> {
  const client = await pool.connect();
  let broken: Error | undefined;
  const onError = (err: Error) => {
    broken = err;
  };
  client.on('error', onError);
  try {
    return await fn(client);
  } catch (err) {
    if (isConnectionLost(err)) broken ??= err as Error;
    throw err;
  } finally {
    client.off('error', onError);
    client.release(broken ?? false);
  }
}

/** Runs `fn` with a one-off client on `config`, ended (never left open) however `fn` ends. */
export async function withClient<T>(
  config: pg.ClientConfig,
  fn: (client: pg.Client) => Promise<T>,
): Promise<T> {
  const client = new pg.Client(config);
  client.on('error', () => {
    // The pending query (or connect) rejects with the same failure; nothing else to do.
  });
  try {
    await client.connect();
    return await fn(client);
  } finally {
    await client.end().catch(() => {});
  }
}

/** The last query sent through {@link queryInTurn} on each client (settled or not). */
const turns = new WeakMap<pg.ClientBase, Promise<unknown>>();

/**
 * `client.query(config)`, sent once every query sent before it through here has finished: for a
 * client that several flows share (the LISTEN connection: its heartbeat, acknowledgements and
 * LISTEN / UNLISTEN), which would otherwise queue a query behind one still running — what pg
 * deprecates, and pg 9 refuses.
 */
export function queryInTurn<R extends pg.QueryResultRow = pg.QueryResultRow>(
  client: pg.ClientBase,
  config: string | pg.QueryConfig,
): Promise<pg.QueryResult<R>> {
  const before = turns.get(client) ?? Promise.resolve();
  const send = () => client.query<R>(config);
  const sent = before.then(send, send);
  turns.set(
    client,
    sent.then(
      () => undefined,
      () => undefined,
    ),
  );
  return sent;
}
