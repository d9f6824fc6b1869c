import type { Job } from '../job.js';
import type { DatatableClient, DatatableConnector } from './datatable_connector.js';
import { type DatatableRef, parseDatatableRef } from './datatable_ref.js';

/**
 * Lends `fn` a data-table connection for `job` — `'datatable://main?as=viewer'` is the job's
 * viewer's (`createDatatables().connect` underneath) — and releases it when `fn` settles,
 * however it settles: reset and pooled, so nothing the code did to the session outlives it.
 * For your own executor; runnables of `createExecutor` use `ctx.datatable` instead.
 */
export async function withDatatableClient<T>(
  connector: DatatableConnector,
  job: Job,
  reference: string | DatatableRef,
  fn: (client: DatatableClient) => Promise<T>,
): Promise<T> {
  const ref = typeof reference === 'string' ? parseDatatableRef(reference) : reference;
  const lease = await connector.connect(job, ref);
  try {
    return await fn(lease.client);
  } finally {
    await lease.release(false);
  }
}
