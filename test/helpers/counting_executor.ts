import type { Job, JobExecutor, JobResult, RunOptions } from '../../src/index.js';
import { ComputedResult } from '../../src/job_result.js';

/**
 * A stand-in for the platform's executor (a seam, not our code): records every job it is asked
 * to run and answers with `behaviour(job)`. By default the value names the viewer it was
 * computed for, so a test can see whose result it got.
 */
export class CountingExecutor implements JobExecutor {
  readonly jobs: Job[] = [];
  behaviour: (job: Job, options: RunOptions | undefined) => unknown;

  constructor(behaviour?: (job: Job, options: RunOptions | undefined) => unknown) {
    this.behaviour =
      behaviour ??
      ((job) => ({ viewer: job.perms.endUserEmail, args: job.args, run: this.jobs.length }));
  }

  get calls(): number {
    return this.jobs.length;
  }

  callsFor(viewer: string | null): number {
    return this.jobs.filter((job) => job.perms.endUserEmail === viewer).length;
  }

  async run(job: Job, options?: RunOptions): Promise<JobResult> {
    this.jobs.push(job);
    const value = await this.behaviour(job, options);
    return new ComputedResult(job.id, value);
  }
}
