import type { CachedExecutor, Executor, Logger } from '../../index.js';
import { ViewerCacheError } from '../../index.js';
import type {
  BatchSummary,
  PerRecipientRuns,
  Recipients,
} from '../recipients/per_recipient_runs.js';

export interface ScheduleDefinition {
  readonly name: string;
  readonly path: string;
  /** The schedule runs as its owner, with no viewer. */
  readonly owner: string;
  /**
   * Run once per recipient instead: each run as the owner with that recipient as its viewer,
   * each result delivered to that recipient's outbox only (per_recipient_runs.ts).
   */
  readonly recipients?: Recipients;
}

export interface ScheduleStatus {
  readonly name: string;
  readonly path: string;
  readonly runs: number;
  readonly lastRunAt: string | null;
  /** `ok`, or the error code of the last run (E_NO_VIEWER for a viewer-only runnable). */
  readonly lastOutcome: string | null;
  /** A per-recipient schedule's last batch: its id and counts, never a row or a recipient. */
  readonly lastBatch?: Omit<BatchSummary, 'outcomes'>;
}

/**
 * Runs each schedule on an interval as its owner (origin `schedule`: no viewer). A runnable that
 * asks for the viewer is refused with E_NO_VIEWER — the point the demo makes.
 */
export class Scheduler {
  readonly #status = new Map<
    string,
    {
      runs: number;
      lastRunAt: string | null;
      lastOutcome: string | null;
      lastBatch?: Omit<BatchSummary, 'outcomes'>;
    }
  >();
  #timer: NodeJS.Timeout | undefined;

  constructor(
    readonly workspace: string,
    readonly schedules: readonly ScheduleDefinition[],
    private readonly executor: Executor,
    private readonly cache: CachedExecutor,
    private readonly logger: Logger,
    /** Runs the schedules that name recipients; without it, they fail with E_INTERNAL. */
    private readonly perRecipient?: PerRecipientRuns,
  ) {
    for (const schedule of schedules)
      this.#status.set(schedule.name, { runs: 0, lastRunAt: null, lastOutcome: null });
  }

  /** Runs every schedule once now. */
  async tick(): Promise<void> {
    await Promise.all(this.schedules.map((schedule) => this.#runOne(schedule)));
  }

  start(everyMs: number): void {
    this.#timer = setInterval(() => void this.tick(), everyMs);
    this.#timer.unref();
  }

  stop(): void {
    clearInterval(this.#timer);
  }

  status(): ScheduleStatus[] {
    return this.schedules.map((schedule) => ({
      name: schedule.name,
      path: schedule.path,
      ...this.#status.get(schedule.name)!,
    }));
  }

  async #runOne(schedule: ScheduleDefinition): Promise<void> {
    const state = this.#status.get(schedule.name)!;
    state.runs++;
    state.lastRunAt = new Date().toISOString();
    try {
      if (schedule.recipients !== undefined) {
        if (this.perRecipient === undefined) throw new Error('no per-recipient runner');
        const { outcomes: _none, ...batch } = await this.perRecipient.run({
          workspace: this.workspace,
          path: schedule.path,
          runAs: schedule.owner,
          recipients: schedule.recipients,
        });
        state.lastBatch = batch;
        state.lastOutcome = 'ok';
        return;
      }
      const job = this.executor.createJob({
        workspace: this.workspace,
        path: schedule.path,
        runAs: schedule.owner,
        origin: { kind: 'schedule' },
      });
      await this.cache.run(job);
      state.lastOutcome = 'ok';
    } catch (err) {
      state.lastOutcome = err instanceof ViewerCacheError ? err.code : 'E_INTERNAL';
      this.logger.warn(
        { schedule: schedule.name, code: state.lastOutcome },
        'scheduled run refused or failed',
      );
    }
  }
}
