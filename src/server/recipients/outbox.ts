import type pg from 'pg';
import { DEFAULT_OUTBOX_RETENTION_MS } from '../process/config.js';
import { SERVER_SCHEMA } from '../process/server_migrations.js';

/** One delivery to one recipient: their own result, or the code their run was refused with. */
export interface OutboxItem {
  readonly id: string;
  readonly batch: string;
  readonly runnable: string;
  readonly createdAt: string;
  /** Whether the run was served from the cache (the recipient's own earlier entry). */
  readonly fromCache: boolean;
  readonly result?: unknown;
  readonly error?: { readonly code: string };
}

export type Delivery =
  | { readonly json: Uint8Array; readonly fromCache: boolean }
  | { readonly errorCode: string };

/** The most a recipient reads back in one call, newest first. */
export const OUTBOX_PAGE = 100;

/** Rows one sweep statement deletes at most (short statements, short locks). */
const SWEEP_CHUNK = 10_000;

export interface OutboxOptions {
  /**
   * How long a delivery is kept (ms): older rows are never read back, and {@link Outbox.sweep}
   * deletes them. @default 7 days
   */
  readonly retentionMs?: number;
}

/**
 * Per-recipient deliveries (`viewer_cache_server.outbox`). Every read is keyed by the workspace
 * and the recipient's email, which the caller takes from an authenticated identity only: there is
 * no way to name another recipient's rows. Rows live for the retention: a read never returns an
 * older one, whether or not a sweep has deleted it yet.
 */
export class Outbox {
  readonly retentionMs: number;

  constructor(
    private readonly pool: pg.Pool,
    options: OutboxOptions = {},
  ) {
    const retention = options.retentionMs ?? DEFAULT_OUTBOX_RETENTION_MS;
    if (!Number.isInteger(retention) || retention < 1) {
      throw new TypeError('outbox retentionMs must be a positive integer of milliseconds');
    }
    this.retentionMs = retention;
  }

  /**
   * Deletes the deliveries older than the retention, in chunks; returns how many. Any number of
   * processes may sweep at once (a row is deleted once; the others skip it).
   */
  async sweep(): Promise<number> {
    let deleted = 0;
    for (;;) {
      const { rowCount } = await this.pool.query(
        `delete from ${SERVER_SCHEMA}.outbox where id in (
           select id from ${SERVER_SCHEMA}.outbox
            where created_at < now() - $1 * interval '1 millisecond'
            order by created_at limit ${SWEEP_CHUNK}
              for update skip locked)`,
        [this.retentionMs],
      );
      deleted += rowCount ?? 0;
      if ((rowCount ?? 0) < SWEEP_CHUNK) return deleted;
    }
  }

  async deliver(
    workspace: string,
    recipient: string,
    batch: string,
    runnable: string,
    delivery: Delivery,
  ): Promise<void> {
    const ok = 'json' in delivery;
    await this.pool.query(
      `insert into ${SERVER_SCHEMA}.outbox
         (workspace, recipient, batch, runnable, result, error_code, from_cache)
       values ($1, $2, $3, $4, $5::jsonb, $6, $7)`,
      [
        workspace,
        recipient,
        batch,
        runnable,
        ok ? Buffer.from(delivery.json).toString('utf8') : null,
        ok ? null : delivery.errorCode,
        ok ? delivery.fromCache : false,
      ],
    );
  }

  /**
   * `recipient`'s own deliveries in `workspace` within the retention, newest delivery first
   * (at most {@link OUTBOX_PAGE}). By delivery time, not id: the ids of one batch's concurrent
   * deliveries are not in delivery order, and a page cut by id dropped the newest.
   */
  async list(workspace: string, recipient: string): Promise<OutboxItem[]> {
    const { rows } = await this.pool.query<{
      id: string;
      batch: string;
      runnable: string;
      created_at: Date;
      from_cache: boolean;
      result: unknown;
      error_code: string | null;
    }>(
      `select id::text, batch::text, runnable, created_at, from_cache, result, error_code
         from ${SERVER_SCHEMA}.outbox
        where workspace = $1 and recipient = $2
          and created_at >= now() - $3 * interval '1 millisecond'
        order by created_at desc, id desc limit ${OUTBOX_PAGE}`,
      [workspace, recipient, this.retentionMs],
    );
    return rows.map((row) => ({
      id: row.id,
      batch: row.batch,
      runnable: row.runnable,
      createdAt: row.created_at.toISOString(),
      fromCache: row.from_cache,
      ...(row.error_code === null ? { result: row.result } : { error: { code: row.error_code } }),
    }));
  }
}
