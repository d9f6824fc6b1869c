import { type Command, InvalidArgumentError } from 'commander';
import {
  InvalidationUnsupportedError,
  publishInvalidation,
  StoreUnavailableError,
  ViewerCacheError,
} from '../../index.js';
import { readConfig } from '../process/config.js';
import { openRedis } from '../process/connections.js';
import { output, table, workspaceOf } from './cli_context.js';
import { invalidateDatatable } from './cli_rules.js';

/** `viewer-cache cache invalidate|stats`: the result cache, through Redis or a running server. */
export function addCacheCommands(program: Command): void {
  const cache = program.command('cache').description('the result cache');
  cache
    .command('invalidate')
    .description(
      'drop the cached results of the workspace (-w), or of one runnable with --path, in every server sharing REDIS_URL; or, with --datatable, every entry that depended on a data table',
    )
    .option('--path <path>', "one runnable's path (default: the whole workspace)")
    .option(
      '--datatable <name>',
      'every entry whose run depended on this data table, in every process on the catalog (a rule change the library cannot see)',
    )
    .action(async (options: { path?: string; datatable?: string }) => {
      const workspace = workspaceOf(program);
      if (options.datatable !== undefined) {
        if (options.path !== undefined)
          throw new InvalidArgumentError('give --path or --datatable, not both');
        await invalidateDatatable(program, workspace, options.datatable);
        return;
      }
      const { prefix, receivers } = await invalidateCache(workspace, options.path);
      const what =
        options.path === undefined
          ? `workspace ${workspace}`
          : `${options.path} in workspace ${workspace}`;
      output(
        program,
        { invalidated: { workspace, path: options.path ?? null }, prefix, receivers },
        () =>
          `invalidated ${what} (prefix ${JSON.stringify(prefix)}; heard by ${receivers} server process${receivers === 1 ? '' : 'es'})`,
      );
    });
  cache
    .command('stats')
    .description('cache counters of a running server')
    .option('--url <url>', 'server URL', `http://127.0.0.1:${process.env['PORT'] ?? 3000}`)
    .action(async (options: { url: string }) => {
      const response = await fetch(new URL('/api/cache/stats', options.url));
      if (!response.ok) throw new Error(`the server answered ${response.status}`);
      const stats = (await response.json()) as Record<string, unknown>;
      output(program, stats, (value) =>
        table(
          ['COUNTER', 'VALUE'],
          Object.entries(value).map(([key, count]) => [key, String(count)]),
          '(no counters)',
        ),
      );
    });
}

/**
 * Bumps the epoch through Redis: every server on the same Redis and prefix hears it on its bus
 * (or reads it from Redis if its bus is down). Without Redis each server's cache lives in its
 * own memory, out of reach of another process: refused.
 */
async function invalidateCache(
  workspace: string,
  path: string | undefined,
): Promise<{ prefix: string; receivers: number }> {
  const config = readConfig();
  if (config.redisUrl === null) {
    throw new InvalidationUnsupportedError(
      'cache invalidate needs REDIS_URL (the Redis the servers share); without it each server keeps its cache in its own memory: restart the server instead',
    );
  }
  const redis = openRedis(config);
  redis.on('error', () => {}); // the command below reports its own failure
  const timeoutMs = Math.max(config.redisTimeoutMs, 2000);
  try {
    // The client queues nothing while it connects: wait for it, within the same bound.
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new StoreUnavailableError(`redis did not answer within ${timeoutMs} ms`)),
        timeoutMs,
      );
      redis.once('ready', () => {
        clearTimeout(timer);
        resolve();
      });
    });
    const { receivers } = await publishInvalidation(
      redis,
      path === undefined ? { workspace } : { workspace, path },
      { prefix: config.redisPrefix, timeoutMs },
    );
    if (receivers === 0) {
      // Said "invalidated" and exited 0 before, while every server kept hitting: nobody heard it.
      throw new ViewerCacheError(
        `no server heard the invalidation under prefix ${JSON.stringify(config.redisPrefix)}: no running server shares this REDIS_URL and VIEWER_CACHE_REDIS_PREFIX (the epoch was bumped: a server that starts later sees it)`,
        { code: 'E_INVALIDATION_UNHEARD' },
      );
    }
    return { prefix: config.redisPrefix, receivers };
  } finally {
    redis.disconnect();
  }
}
