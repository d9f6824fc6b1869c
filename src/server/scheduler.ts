import type { CachedExecutor, Executor, Logger } from '../index.js';
import { ViewerCacheError } from '../index.js';

export interface ScheduleDefinition {
  readonly name: string;
  readonly path: string;
  /** The schedule runs as its owner, with no viewer. */
  readonly owner: string;
}

export interface ScheduleStatus {
  readonly name: string;
  readonly path: string;
  readonly runs: number;
  readonly lastRunAt: string | null;
  /** `ok`, or the error code of the last run (E_NO_VIEWER for a viewer-only runnable). */
  readonly lastOutcome: string | null;
}

/**
 * Runs each schedule on an interval as its owner (origin `schedule`: no viewer). A runnable that
 * asks for the viewer is refused with E_NO_VIEWER — the point the demo makes.
 */
export class Scheduler {
  readonly #status = new Map<
    string,
    { runs: number; lastRunAt: string | null; lastOutcome: string | null }
  >();
  #timer: NodeJS.Timeout | undefined;

  constructor(
    readonly workspace: string,
    readonly schedules: readonly ScheduleDefinition[],
    private readonly executor: Executor,
    private readonly cache: CachedExecutor,
    private readonly logger: Logger,
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
