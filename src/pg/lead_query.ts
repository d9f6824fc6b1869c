import pg from 'pg';

/** A statement with parameters (text values only), sent ahead of a run's statement. */
export interface LeadStatement {
  readonly text: string;
  readonly values: readonly string[];
}

/** The protocol calls a pg Query makes; not in pg's public types. */
interface ProtocolConnection {
  parse(message: { text: string; types: readonly number[] }): void;
  bind(message: { values: readonly string[] }): void;
  execute(message: { portal: string; rows: number }): void;
}

interface QueryInternals {
  prepare(connection: ProtocolConnection): void;
  handleDataRow(message: unknown): void;
  handleCommandComplete(message: unknown, connection: unknown): void;
  handleError(err: Error, connection: unknown): void;
}

type QueryCallback = (err: Error | undefined, result: pg.QueryResult) => void;

const Query = pg.Query as unknown as new (
  config: pg.QueryConfig,
  values: undefined,
  callback: QueryCallback,
) => pg.Query & QueryInternals;

/**
 * A query that carries statements of the library's own in front of it, in the same Sync: one
 * implicit transaction, one flush of the server's answers, one wake-up. A separate Sync per
 * statement (pg's pipeline mode) measured 60–75 µs more per run on this machine class. Their
 * rows are dropped; if one of them fails, the server skips the query itself (`leadFailed`).
 */
class LeadQuery extends Query {
  #pending: number;
  leadFailed = false;

  constructor(
    readonly lead: readonly LeadStatement[],
    config: pg.QueryConfig,
    callback: QueryCallback,
  ) {
    super({ ...config, queryMode: 'extended' } as pg.QueryConfig, undefined, callback);
    this.#pending = lead.length;
  }

  override prepare(connection: ProtocolConnection): void {
    for (const statement of this.lead) {
      connection.parse({ text: statement.text, types: [] });
      connection.bind({ values: statement.values });
      connection.execute({ portal: '', rows: 0 });
    }
    super.prepare(connection);
  }

  override handleDataRow(message: unknown): void {
    if (this.#pending === 0) super.handleDataRow(message);
  }

  override handleCommandComplete(message: unknown, connection: unknown): void {
    if (this.#pending > 0) this.#pending -= 1;
    else super.handleCommandComplete(message, connection);
  }

  override handleError(err: Error, connection: unknown): void {
    this.leadFailed = this.#pending > 0;
    super.handleError(err, connection);
  }
}

/**
 * Sends `lead` and then the query on `client` in one Sync; resolves with the query's own result.
 * Always the extended protocol, a query without parameters too: the lead's values travel as
 * parameters, never as text another session of the login could read in `pg_stat_activity`.
 * (A text holding several statements is refused by the extended protocol: see PooledLease.)
 */
export function queryWithLead(
  client: pg.ClientBase,
  lead: readonly LeadStatement[],
  config: pg.QueryConfig,
): { result: Promise<pg.QueryResult>; leadFailed(): boolean } {
  let query: LeadQuery | undefined;
  const result = new Promise<pg.QueryResult>((resolve, reject) => {
    query = new LeadQuery(lead, config, (err, res) => (err ? reject(err) : resolve(res)));
    client.query(query);
  });
  return { result, leadFailed: () => query!.leadFailed };
}
