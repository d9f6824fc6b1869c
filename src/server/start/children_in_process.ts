import type { Executor, Job, JobExecutor, JobRequest, RunOptions } from '../../index.js';

/**
 * With jobs on workers (`VIEWER_CACHE_EXECUTION=queue` or `agent`): what the server's result
 * cache runs a miss on. A job started with a job token — a runnable's child run over HTTP,
 * `POST /api/w/:ws/jobs/run_child` — runs here, in process (`local`); every other miss goes to
 * the workers (`remote`: the queue, or the agents). Jobs are built by `jobs` (the queue
 * executor records each job's origin kind for its record).
 *
 * Why: the parent holds its worker (or agent) slot while it waits for the child. Handed to the
 * workers, the child waits for a slot too, and once every slot is held by a parent (one worker
 * of concurrency 1 and one parent are enough) nothing ever runs it: the parent's request failed
 * at the wait (60 s, E_QUEUE_TIMEOUT or E_EXECUTOR_TIMEOUT) and held its slot until then,
 * stalling every job behind it.
 *
 * Nothing about the viewer changes: the child's viewer is its parent's, which the server read
 * from the shared job token (Postgres) when it built the job, and its key is the same wherever
 * it runs (a hit is still answered before anything runs).
 */
export function childrenInProcess(parts: {
  jobs: Executor;
  remote: JobExecutor;
  local: JobExecutor;
}): Executor {
  const { jobs, remote, local } = parts;
  const children = new WeakSet<Job>();
  return {
    runnable: (path) => jobs.runnable(path),
    createJob(request: JobRequest): Job {
      const job = jobs.createJob(request);
      if (request.origin.kind === 'job-token') children.add(job);
      return job;
    },
    run(job: Job, options?: RunOptions) {
      return children.has(job) ? local.run(job, options) : remote.run(job, options);
    },
  };
}
