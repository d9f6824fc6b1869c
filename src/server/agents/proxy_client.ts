import {
  AGENT_PROTOCOL_VERSION,
  accessToRoleName,
  type CopyBound,
  clientTraced,
  type DatatableConnector,
  type DatatableLease,
  type DatatableQueryResult,
  type Job,
  JobTokenInvalidError,
} from '../../index.js';
import { AGENT_PROTOCOL_HEADER, failureOf, JOB_TOKEN_HEADER } from './agent_protocol.js';

export interface ProxyClientOptions {
  /** The server's base URL (`VIEWER_CACHE_SERVER_URL`). */
  readonly serverUrl: URL;
  /** The agent's token (`VIEWER_CACHE_AGENT_TOKEN`). */
  readonly agentToken: string;
  /** The token the server issued with the job (or its parent's, for a child run here). */
  readonly jobTokenOf: (job: Job) => string | undefined;
}

/**
 * A {@link DatatableConnector} for an agent worker: every statement goes to the server's query
 * proxy with the job's token and the request spelt as a role name (`DATATABLE_VIEWER_ROLE` for
 * the viewer), and the server runs it as the job's recorded viewer. The runnable gets the same
 * `client.query(text, values)` as in process; nothing here holds a login, a password or a
 * connection string. A statement on its own is a lease of its own on the server; `BEGIN` …
 * `COMMIT`/`ROLLBACK` on one client is one transaction there, held under the id the server
 * answered BEGIN with, and the client's statements go one after another (as on one connection).
 */
export function createProxyConnector(options: ProxyClientOptions): DatatableConnector {
  const url = new URL('/api/agent/query', options.serverUrl);
  const holdsUrl = new URL('/api/agent/holds', options.serverUrl);
  const post = async (target: URL, jobToken: string, body: unknown) => {
    const response = await fetch(target, {
      method: 'POST',
      headers: {
        authorization: `Bearer ${options.agentToken}`,
        [AGENT_PROTOCOL_HEADER]: String(AGENT_PROTOCOL_VERSION),
        [JOB_TOKEN_HEADER]: jobToken,
        'content-type': 'application/json',
      },
      body: JSON.stringify(body),
    });
    const parsed = (await response.json().catch(() => null)) as
      | ({ error?: { code?: string; message?: string } } & Record<string, unknown>)
      | null;
    if (!response.ok || parsed === null || parsed.error !== undefined) {
      throw failureOf(
        parsed?.error?.code ?? 'E_EXECUTOR_FAILED',
        parsed?.error?.message ?? `the query proxy answered ${response.status}`,
      );
    }
    return parsed;
  };
  return {
    // The server's proxy bounds and resets every statement it runs for us.
    proxied: true,
    async viewerHolds(job, datatable, role) {
      const jobToken = options.jobTokenOf(job);
      if (jobToken === undefined) throw new JobTokenInvalidError('this job has no job token');
      return (await post(holdsUrl, jobToken, { datatable, role }))['holds'] === true;
    },
    async connect(job, ref): Promise<DatatableLease> {
      const jobToken = options.jobTokenOf(job);
      if (jobToken === undefined) throw new JobTokenInvalidError('this job has no job token');
      const reference = { datatable: ref.name, role: accessToRoleName(ref.access) };
      // The transaction this client is in, as the server answered its BEGIN (null: none). The
      // server decides what a text is (its grammar): this client only carries the id it was
      // given, and forgets it when an answer says the transaction ended.
      let transaction: string | null = null;
      // One statement after another, as on one connection in process: a statement sent after
      // BEGIN must carry the id BEGIN is answered with.
      let turn: Promise<unknown> = Promise.resolve();
      const send = async (
        text: string,
        values: readonly unknown[] | undefined,
        copy: CopyBound | undefined,
        signal?: AbortSignal,
      ): Promise<DatatableQueryResult> => {
        // One CLIENT span per statement; its context goes with it (the server's span joins it).
        const response = await clientTraced('viewer_cache.agent.query', (traceparent) =>
          fetch(url, {
            method: 'POST',
            headers: {
              authorization: `Bearer ${options.agentToken}`,
              [AGENT_PROTOCOL_HEADER]: String(AGENT_PROTOCOL_VERSION),
              [JOB_TOKEN_HEADER]: jobToken,
              'content-type': 'application/json',
              ...(traceparent === null ? {} : { traceparent }),
            },
            body: JSON.stringify({
              reference,
              sql: text,
              params: values ?? [],
              transaction,
              ...(copy === undefined ? {} : { copy }),
            }),
            ...(signal === undefined ? {} : { signal }),
          }),
        );
        const body = (await response.json().catch(() => null)) as
          | (DatatableQueryResult & {
              transaction?: string | null;
              error?: { code?: string; message?: string; sqlstate?: string };
            })
          | null;
        if (body !== null && body.transaction !== undefined) transaction = body.transaction;
        if (!response.ok || body === null || !Array.isArray(body.rows)) {
          const error = body?.error;
          if (error?.code === 'E_QUERY_FAILED' && typeof error.sqlstate === 'string')
            throw new StatementFailedError(error.message ?? 'the statement failed', error.sqlstate);
          throw failureOf(
            error?.code ?? 'E_EXECUTOR_FAILED',
            error?.message ?? `the query proxy answered ${response.status}`,
          );
        }
        return { rows: body.rows, rowCount: body.rowCount ?? null };
      };
      const ask = (
        text: string,
        values: readonly unknown[] | undefined,
        copy: CopyBound | undefined,
      ): Promise<DatatableQueryResult> => {
        const sent = turn.then(() => send(text, values, copy));
        turn = sent.catch(() => {});
        return sent;
      };
      const query = (text: string, values?: readonly unknown[]) => ask(text, values, undefined);
      const client = Object.freeze({
        query: <Row = Record<string, unknown>>(text: string, values?: readonly unknown[]) =>
          query(text, values) as Promise<DatatableQueryResult<Row>>,
      });
      // A DuckDB copy asks the proxy for its own bound (duckdb.maxRows / maxBytes) instead of
      // the per-statement 10 000 rows, so that it is bounded here as in process.
      const copy = (text: string, values: readonly unknown[], bound: CopyBound) =>
        ask(text, values, bound);
      return {
        client,
        query,
        copy,
        // A transaction the runnable left open is rolled back, as closing its connection does in
        // process (and the server rolls it back anyway when the job ends or its bounds pass).
        // Not in turn, and bounded: a statement still in flight (a job that timed out) is not
        // waited for; the server orders it before the ROLLBACK, or, for a BEGIN still in flight,
        // rolls it back when the job ends.
        release: async () => {
          if (transaction === null) return;
          await send('rollback', [], undefined, AbortSignal.timeout(RELEASE_ROLLBACK_MS)).catch(
            () => {},
          );
        },
      };
    },
  };
}

/** Longest a released client waits for the ROLLBACK of a transaction left open (ms). */
const RELEASE_ROLLBACK_MS = 5000;

/**
 * A statement Postgres refused on the server, in the shape pg gives it in process (`code` is the
 * SQLSTATE, `severity` set), so a runnable's `catch` reads the same on an agent.
 */
class StatementFailedError extends Error {
  readonly severity = 'ERROR';
  constructor(
    message: string,
    readonly code: string,
  ) {
    super(message);
    this.name = 'error';
  }
}
