import type { Executor, Job, JobRequest, RunOptions } from '../index.js';

/**
 * With jobs on workers (`VIEWER_CACHE_EXECUTION=queue`): what the server's result cache runs a
 * miss on. A job started with a job token — a runnable's child run over HTTP,
 * `POST /api/w/:ws/jobs/run_child` — runs here, in process; every other miss goes to the queue.
 *
 * Why: the parent holds its worker slot while it waits for the child. Queued, the child waits
 * for a slot too, and once every slot is held by a parent (one worker of concurrency 1 and one
 * parent are enough) nothing ever runs it: the parent's request failed at the queue's wait
 * (60 s, E_QUEUE_TIMEOUT) and its slot stayed held until then, stalling every job behind it.
 * Agent workers do the same for the same reason (a child runs on its parent's agent).
 *
 * Nothing about the viewer changes: the child's viewer is its parent's, which the server read
 * from the shared job token (Postgres) when it built the job, and its key is the same wherever
 * it runs (a hit is still answered before anything runs).
 */
export function childrenInProcess(queue: Executor, local: Executor): Executor {
  const children = new WeakSet<Job>();
  return {
    runnable: (path) => queue.runnable(path),
    createJob(request: JobRequest): Job {
      const job = queue.createJob(request);
      if (request.origin.kind === 'job-token') children.add(job);
      return job;
    },
    run(job: Job, options?: RunOptions) {
      return children.has(job) ? local.run(job, options) : queue.run(job, options);
    },
  };
}
