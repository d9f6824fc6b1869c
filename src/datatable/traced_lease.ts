/*
 * A lent data-table connection whose statements are traced: one span per statement a runnable
 * sends, named by its operation, with the database semantic conventions' attributes — the
 * system, the database's name, the operation, the rows returned, the SQLSTATE of a refusal.
 * Never a bound value or a row; the text only when the user opted in, and then sanitized.
 */
import { SpanKind, type Tracer } from '@opentelemetry/api';
import type { DatatableLease, DatatableQueryResult } from '../connector/datatable_connector.js';
import { inSpan, operationOf, sanitizeStatement } from '../tracing.js';

/** `lease` with a span per statement (through `query`, `client.query` and `copy` alike). */
export function traceLease(
  lease: DatatableLease,
  tracer: Tracer,
  database: string,
  statementText: boolean,
): DatatableLease {
  const traced = <R extends DatatableQueryResult>(
    text: string,
    send: () => Promise<R>,
  ): Promise<R> => {
    const operation = operationOf(text);
    return inSpan(
      tracer,
      operation,
      {
        'db.system.name': 'postgresql',
        'db.namespace': database,
        'db.operation.name': operation,
        ...(statementText ? { 'db.query.text': sanitizeStatement(text) } : {}),
      },
      async (span) => {
        const result = await send();
        if (Array.isArray(result.rows))
          span.setAttribute('db.response.returned_rows', result.rows.length);
        return result;
      },
      SpanKind.CLIENT,
    );
  };
  const query = (text: string, values?: readonly unknown[]) =>
    traced(text, () => lease.query(text, values));
  const copy = lease.copy;
  // Frozen with no data properties, as the lease it stands for: nothing to read off it.
  return Object.freeze({
    client: Object.freeze({
      query: <Row = Record<string, unknown>>(text: string, values?: readonly unknown[]) =>
        query(text, values) as Promise<DatatableQueryResult<Row>>,
    }),
    query,
    ...(copy === undefined
      ? {}
      : {
          copy: (text: string, values: readonly unknown[], bound: Parameters<typeof copy>[2]) =>
            traced(text, () => copy.call(lease, text, values, bound)),
        }),
    release: (destroy: boolean) => lease.release(destroy),
  });
}
