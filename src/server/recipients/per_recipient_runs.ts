import { randomUUID } from 'node:crypto';
import { type CachedExecutor, type Executor, type Logger, ViewerCacheError } from '../../index.js';
import type { Outbox } from './outbox.js';

/** Who a per-recipient job runs for: a list of emails, or the members of a group. */
export type Recipients = { readonly emails: readonly string[] } | { readonly group: string };

export interface PerRecipientRequest {
  readonly workspace: string;
  readonly path: string;
  readonly args?: Record<string, unknown>;
  /** Who every run runs *as* (the app's publisher, the schedule's owner). */
  readonly runAs: string;
  readonly recipients: Recipients;
  /** A scoped key's catalog ids: every run of the batch holds at most these (as an app run). */
  readonly roleScope?: readonly number[];
}

/**
 * What the starter of a batch learns: counts, and (for a list they gave) each recipient's outcome
 * in their order — `ok` or an error code. Never a row, and never who is in a group.
 */
export interface BatchSummary {
  readonly batch: string;
  readonly recipients: number;
  readonly delivered: number;
  readonly fromCache: number;
  /** Refusals and failures by code. */
  readonly refused: Readonly<Record<string, number>>;
  readonly outcomes?: readonly string[];
}

/** Outcome of a recipient whose delivery could not be written (their run itself succeeded). */
export const OUTBOX_FAILED = 'E_OUTBOX_FAILED';

/**
 * Runs one runnable once per recipient, each run with that recipient as its viewer (origin
 * `recipient`), through the cached executor (so each recipient's result is cached for them like
 * any run), and delivers each result to that recipient's outbox only. A refusal or failure of one
 * recipient (E_NO_ROLES, E_ROLE_REQUIRED, …) is recorded as their outcome and never stops the
 * others. A few runs at a time, so a large group does not take every data-table connection.
 */
export class PerRecipientRuns {
  constructor(
    private readonly deps: {
      readonly executor: Executor;
      readonly cache: CachedExecutor;
      readonly outbox: Outbox;
      /** The members of a group of the workspace's directory. */
      readonly members: (workspace: string, group: string) => Promise<string[]>;
      readonly logger: Logger;
      /** Runs at a time within one batch. @default 4 */
      readonly concurrency?: number;
    },
  ) {}

  async run(request: PerRecipientRequest): Promise<BatchSummary> {
    const listed = 'emails' in request.recipients;
    const recipients =
      'emails' in request.recipients
        ? request.recipients.emails
        : await this.deps.members(request.workspace, request.recipients.group);
    // One run per distinct recipient; a repeated email gets the first one's outcome.
    const distinct = [...new Set(recipients)];
    const batch = randomUUID();
    const outcomes = new Map<string, { code: string; fromCache: boolean }>();
    let next = 0;
    const worker = async () => {
      while (next < distinct.length) {
        const email = distinct[next++]!;
        outcomes.set(email, await this.#runFor(request, batch, email));
      }
    };
    const concurrency = Math.max(1, this.deps.concurrency ?? 4);
    await Promise.all(Array.from({ length: Math.min(concurrency, distinct.length) }, worker));

    const refused: Record<string, number> = {};
    let delivered = 0;
    let fromCache = 0;
    for (const { code, fromCache: hit } of outcomes.values()) {
      if (code === 'ok') delivered++;
      else refused[code] = (refused[code] ?? 0) + 1;
      if (hit) fromCache++;
    }
    // Counts only: recipients' emails never reach a log line.
    this.deps.logger.info(
      { batch, runnable: request.path, recipients: distinct.length, delivered, refused },
      'per-recipient batch done',
    );
    return {
      batch,
      recipients: distinct.length,
      delivered,
      fromCache,
      refused,
      ...(listed ? { outcomes: recipients.map((email) => outcomes.get(email)!.code) } : {}),
    };
  }

  async #runFor(
    request: PerRecipientRequest,
    batch: string,
    email: string,
  ): Promise<{ code: string; fromCache: boolean }> {
    const { executor, cache, outbox, logger } = this.deps;
    let delivery: Parameters<Outbox['deliver']>[4];
    try {
      const job = executor.createJob({
        workspace: request.workspace,
        path: request.path,
        args: request.args ?? {},
        runAs: request.runAs,
        origin: { kind: 'recipient', recipient: { email } },
        ...(request.roleScope === undefined ? {} : { roleScope: request.roleScope }),
      });
      const result = await cache.run(job);
      delivery = { json: result.json(), fromCache: result.fromCache };
    } catch (err) {
      delivery = { errorCode: err instanceof ViewerCacheError ? err.code : 'E_INTERNAL' };
    }
    try {
      await outbox.deliver(request.workspace, email, batch, request.path, delivery);
    } catch (err) {
      // The SQLSTATE only: Postgres's message may quote the row (a recipient, a result).
      logger.warn({ batch, code: (err as { code?: unknown }).code }, 'outbox delivery failed');
      return { code: OUTBOX_FAILED, fromCache: false };
    }
    return 'json' in delivery
      ? { code: 'ok', fromCache: delivery.fromCache }
      : { code: delivery.errorCode, fromCache: false };
  }
}
