import { constants } from 'node:os';
import type { Command } from 'commander';
import { InvalidArgumentError } from 'commander';
import { ConfigError, ViewerCacheError } from '../../index.js';
import { checkAgentEnvironment, startAgentWorker } from '../agents/agent_worker.js';
import { AgentTokens, GROUP_RE } from '../credentials/agent_tokens.js';
import { DEMO_APPS, loadApps } from '../demo/demo_apps.js';
import { readConfig } from '../process/config.js';
import { createServerLogger } from '../process/server_logger.js';
import { onStopSignals } from '../process/shutdown.js';
import { output, table, withCatalog, workspaceOf } from './cli_context.js';

function groupArg(value: string): string {
  if (!GROUP_RE.test(value)) {
    throw new InvalidArgumentError('a worker group is 1-63 lowercase letters, digits, _ or -');
  }
  return value;
}

/** `agent-token create|list|revoke`: agent workers' bearer tokens, stored hashed. */
export function addAgentTokenCommands(program: Command): void {
  const ws = () => workspaceOf(program);
  const agentToken = program
    .command('agent-token')
    .description("agent workers' tokens: take a worker group's jobs, hold no database credential");
  agentToken
    .command('create')
    .description('create a token for agents of a worker group (printed once; stored hashed)')
    .requiredOption('--group <name>', 'the worker group its agents take jobs of', groupArg)
    .option('--label <text>', 'a note to recognise it by')
    .action((options: { group: string; label?: string }) =>
      withCatalog(async ({ pool }) => {
        const token = await new AgentTokens(pool).create(
          ws(),
          options.group,
          options.label ?? null,
        );
        output(program, { token, workspace: ws(), group: options.group }, (r) => r.token);
      }),
    );
  agentToken
    .command('list')
    .description("list the workspace's agent tokens (an id per token; the tokens are not kept)")
    .action(() =>
      withCatalog(async ({ pool }) => {
        const rows = await new AgentTokens(pool).list(ws());
        output(program, rows, (list) =>
          table(
            ['ID', 'GROUP', 'CREATED', 'LABEL'],
            list.map((r) => [r.id, r.group, String(r.createdAt), r.label ?? '-']),
            '(no agent tokens)',
          ),
        );
      }),
    );
  agentToken
    .command('revoke [id]')
    .description(
      'revoke an agent token by its id (or every token of --group); every server refuses it within a second',
    )
    .option('--group <name>', 'revoke every token of this worker group', groupArg)
    .action((id: string | undefined, options: { group?: string }) =>
      withCatalog(async ({ pool }) => {
        if ((id === undefined) === (options.group === undefined)) {
          throw new ViewerCacheError('name a token id or --group, not both', {
            code: 'E_BAD_REQUEST',
            status: 400,
          });
        }
        const revoked = await new AgentTokens(pool).revoke(
          ws(),
          id === undefined ? { group: options.group! } : { id },
        );
        if (revoked === 0) {
          throw new ViewerCacheError('no such agent token in this workspace', {
            code: 'E_UNKNOWN_TOKEN',
            status: 404,
          });
        }
        output(
          program,
          { revoked },
          () => `revoked ${revoked} agent token${revoked === 1 ? '' : 's'}`,
        );
      }),
    );
}

/**
 * `worker --agent`: an agent worker, configured by VIEWER_CACHE_SERVER_URL and
 * VIEWER_CACHE_AGENT_TOKEN only; refuses to start if a database or Redis URL or the secret key
 * is set (E_AGENT_CREDENTIALS). Runs until SIGINT, SIGTERM or SIGHUP, then finishes the jobs it
 * holds.
 */
export async function runAgentWorker(options: {
  apps?: string;
  demo?: boolean;
  concurrency?: string;
}): Promise<void> {
  const env = process.env;
  checkAgentEnvironment(env);
  const serverUrl = env['VIEWER_CACHE_SERVER_URL'] ?? '';
  const agentToken = env['VIEWER_CACHE_AGENT_TOKEN'] ?? '';
  if (serverUrl === '' || agentToken === '') {
    throw new ViewerCacheError(
      'an agent worker needs VIEWER_CACHE_SERVER_URL and VIEWER_CACHE_AGENT_TOKEN (from `agent-token create --group NAME`)',
      { code: 'E_AGENT_CONFIG', status: 400 },
    );
  }
  let base: URL;
  try {
    base = new URL(serverUrl);
  } catch {
    throw new ViewerCacheError('VIEWER_CACHE_SERVER_URL must be an http(s) URL', {
      code: 'E_AGENT_CONFIG',
      status: 400,
    });
  }
  if ((options.apps === undefined) === (options.demo !== true)) {
    throw new ViewerCacheError(
      'an agent worker runs the apps the server serves: pass --apps PATH or --demo (one of them)',
      { code: 'E_AGENT_CONFIG', status: 400 },
    );
  }
  const concurrency = Number(options.concurrency ?? '1');
  if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 256) {
    throw new ConfigError(
      `--concurrency must be an integer from 1 to 256 (got ${JSON.stringify(String(options.concurrency).slice(0, 20))})`,
    );
  }
  const logger = createServerLogger(readConfig({ ...env }));
  // The same apps module as the server (same runnable versions, or the job is refused as
  // E_UNKNOWN_RUNNABLE): the child-run route is the server's, for a runnable that starts a
  // child over HTTP with its job token.
  const served = await loadApps(options.apps ?? DEMO_APPS, {
    childRunUrl: (workspace) =>
      new URL(`/api/w/${encodeURIComponent(workspace)}/jobs/run_child`, base),
    env,
  });
  const agent = startAgentWorker({
    serverUrl: base,
    agentToken,
    runnables: served.runnables,
    concurrency,
    logger,
    // An interpreter elsewhere than python3 on PATH (a venv, a wrapper): VIEWER_CACHE_PYTHON.
    ...(env['VIEWER_CACHE_PYTHON'] ? { python: { command: env['VIEWER_CACHE_PYTHON'] } } : {}),
  });
  const stop = (signal: string) => {
    logger.info({ signal }, 'agent worker stopping: finishing the jobs it holds');
    void agent.stop();
  };
  onStopSignals(stop, (signal) => {
    // A second signal does not wait for the jobs it holds: the exit a signal's default gives.
    logger.warn({ signal }, 'second signal: not waiting for the jobs it holds');
    process.exit(128 + (constants.signals[signal] ?? 0));
  });
  // Logged once the signals are ours: whoever waits for this line may signal at once.
  logger.info({ concurrency }, 'agent worker started');
  try {
    await agent.done;
  } finally {
    await new Promise<void>((resolve) => logger.flush(() => resolve()));
  }
}
