import type { RunnableDefinition } from '../../src/index.js';

const ids = (rows: Record<string, unknown>[]) => rows.map((r) => r['id'] as number);

/**
 * The runnables of the queue fault tests, shared by the server side (its registry) and the
 * worker process (queue_worker_main.ts): the same definitions, so the same versions.
 */
export const SLOW_RUNNABLES: Record<string, RunnableDefinition> = {
  slow: {
    // An explicit version: the test (vite) and the worker process (tsx) compile the function's
    // source differently, and a version taken from it would differ between them.
    hash: 'slow-v1',
    cacheTtlS: 300,
    fn: async (args, ctx) => {
      const client = await ctx.datatable('main', { as: 'viewer' });
      // Said on stdout so a test can kill the worker mid-job.
      process.stdout.write(`${JSON.stringify({ started: args['n'] ?? null })}\n`);
      await new Promise((resolve) => setTimeout(resolve, Number(args['ms'] ?? 1500)));
      return ids((await client.query('select id from orders order by id')).rows);
    },
  },
};
