import type { Command } from 'commander';
import { ConfigError } from '../../index.js';
import { readConfig } from '../process/config.js';
import { createServerLogger, exitOnFatal } from '../process/server_logger.js';
import { closeOnSignals, onStopSignals } from '../process/shutdown.js';
import { printWelcome } from '../start/welcome.js';
import { runAgentWorker } from './cli_agents.js';
import type { GlobalOptions } from './cli_context.js';
import { flagsGiven, importWithPeers } from './cli_peers.js';

interface ServeOptions {
  port?: string;
  host?: string;
  demo?: boolean;
  apps?: string;
  execution?: string;
  agentGroup?: string;
}

/** `viewer-cache serve` and `viewer-cache worker`: the commands that run until stopped. */
export function addProcessCommands(program: Command): void {
  program
    .command('serve')
    .description(
      'start the HTTP server (embedded Postgres and in-process cache unless DATABASE_URL / REDIS_URL)',
    )
    .option('-p, --port <port>', 'port (default $PORT or 3000)')
    .option('--host <host>', 'interface to listen on (default $HOST or 127.0.0.1)')
    .option(
      '--demo',
      'seed the demo workspace (default: only on the embedded PostgreSQL; $VIEWER_CACHE_DEMO)',
    )
    .option(
      '--apps <path>',
      'serve the apps module at PATH (default export { runnables, apps, hooks?, schedules? }; $VIEWER_CACHE_APPS)',
    )
    .option(
      '--execution <mode>',
      'where misses run: in-process (here), queue (`viewer-cache worker` processes) or agent (agent workers); $VIEWER_CACHE_EXECUTION',
    )
    .option(
      '--agent-group <name>',
      'with --execution agent or queue: the worker group that runs the jobs ($VIEWER_CACHE_AGENT_GROUP)',
    )
    .action(async (options: ServeOptions) => {
      const config = readConfig(
        {
          ...process.env,
          ...(options.apps ? { VIEWER_CACHE_APPS: options.apps } : {}),
          ...(options.port ? { PORT: options.port } : {}),
          ...(options.host ? { HOST: options.host } : {}),
          ...(options.demo ? { VIEWER_CACHE_DEMO: 'true' } : {}),
          ...(options.execution ? { VIEWER_CACHE_EXECUTION: options.execution } : {}),
          ...(options.agentGroup ? { VIEWER_CACHE_AGENT_GROUP: options.agentGroup } : {}),
        },
        flagsGiven(options, {
          apps: ['VIEWER_CACHE_APPS', '--apps'],
          port: ['PORT', '--port'],
          execution: ['VIEWER_CACHE_EXECUTION', '--execution'],
          agentGroup: ['VIEWER_CACHE_AGENT_GROUP', '--agent-group'],
        }),
      );
      // The server (Fastify, embedded PostgreSQL) loads only for `serve`: a library-only install,
      // without those optional peers, still runs every other command and --version.
      const { startServer } = await importWithPeers(() => import('../start/serve.js'));
      const logger = createServerLogger(config);
      exitOnFatal(logger);
      // Signals are handled from the start: a SIGTERM while PostgreSQL starts (or migrations
      // run) stops start-up at its next step, which closes what it opened, PostgreSQL included.
      const abort = new AbortController();
      const starting = startServer(config, logger, { signal: abort.signal });
      const stopped = closeOnSignals(async () => {
        abort.abort(new Error('stopped by a signal during start-up'));
        const server = await starting.catch(() => null);
        await server?.close();
      }, logger);
      const started = await Promise.race([
        starting.catch((err: unknown) => {
          if (abort.signal.aborted) return null; // a requested stop, not a failed start
          throw err;
        }),
        stopped.then(() => null),
      ]);
      if (started === null) {
        await stopped;
        if (abort.signal.aborted) logger.info('stopped during start-up');
      }
      if (started !== null) {
        const json = program.opts<GlobalOptions>().json === true;
        // The JSON ready line is stdout's (machine-readable, one line); the banner for people
        // goes to stderr, so stdout stays the log stream it is when it is not a terminal.
        printWelcome(
          json
            ? process.stdout
            : {
                isTTY: process.stdout.isTTY === true && process.stderr.isTTY === true,
                write: (text: string) => process.stderr.write(text),
              },
          started.url,
          started.demoTokens,
          json,
          { demo: config.seedDemo && config.appsPath === null },
        );
        await stopped;
      }
      // Log lines are written asynchronously: write what is left before the process exits.
      await new Promise<void>((resolve) => logger.flush(() => resolve()));
    });

  program
    .command('worker')
    .description(
      "run jobs for a server: queue workers need DATABASE_URL, REDIS_URL and VIEWER_CACHE_SECRET_KEY; their runnables' child runs over HTTP (with a job token) go to the address their server advertises (sealed in each job), or to VIEWER_CACHE_SERVER_URL when set; --agent takes them over HTTP (VIEWER_CACHE_SERVER_URL + VIEWER_CACHE_AGENT_TOKEN, no database)",
    )
    .option('--agent', 'an agent worker: no DATABASE_URL, REDIS_URL or secret key (refused if set)')
    .option('--apps <path>', 'run the apps module at PATH, as the servers do ($VIEWER_CACHE_APPS)')
    .option(
      '--demo',
      "run the demo's apps ($VIEWER_CACHE_DEMO; one of --apps and --demo is needed)",
    )
    .option('--concurrency <n>', 'jobs run at once (per workspace served)', '1')
    .option(
      '--workspaces <ids>',
      "queue workers: the workspaces whose jobs this worker takes, comma-separated ($VIEWER_CACHE_WORKER_WORKSPACES; default: the apps module's workspace)",
    )
    .option(
      '--group <name>',
      'queue workers: the worker group whose jobs it takes ($VIEWER_CACHE_AGENT_GROUP; default: default)',
    )
    .option(
      '--port <port>',
      'queue workers: serve /healthz and /metrics on this port (default: none)',
    )
    .action(
      async (options: {
        agent?: boolean;
        apps?: string;
        demo?: boolean;
        concurrency: string;
        port?: string;
        workspaces?: string;
        group?: string;
      }) => {
        if (options.agent === true) {
          await runAgentWorker(options);
          return;
        }
        const config = readConfig(
          {
            ...process.env,
            ...(options.apps ? { VIEWER_CACHE_APPS: options.apps } : {}),
            ...(options.demo ? { VIEWER_CACHE_DEMO: 'true' } : {}),
            ...(options.workspaces ? { VIEWER_CACHE_WORKER_WORKSPACES: options.workspaces } : {}),
            ...(options.group ? { VIEWER_CACHE_AGENT_GROUP: options.group } : {}),
          },
          flagsGiven(options, {
            workspaces: ['VIEWER_CACHE_WORKER_WORKSPACES', '--workspaces'],
            group: ['VIEWER_CACHE_AGENT_GROUP', '--group'],
          }),
        );
        const concurrency = Number(options.concurrency);
        if (!Number.isInteger(concurrency) || concurrency < 1 || concurrency > 1000)
          throw new ConfigError(
            `--concurrency must be an integer from 1 to 1000 (got ${JSON.stringify(options.concurrency.slice(0, 20))})`,
          );
        const port = options.port === undefined ? undefined : Number(options.port);
        if (port !== undefined && (!Number.isInteger(port) || port < 0 || port > 65535))
          throw new ConfigError(
            `--port must be an integer between 0 and 65535 (got ${JSON.stringify(String(options.port).slice(0, 20))})`,
          );
        const lock = process.env['VIEWER_CACHE_WORKER_LOCK_MS'];
        // Loaded on demand, as the server is: other commands need neither.
        const { startWorker } = await importWithPeers(() => import('../start/worker.js'));
        const logger = createServerLogger(config);
        exitOnFatal(logger);
        const starting = startWorker(config, logger, {
          concurrency,
          ...(port === undefined ? {} : { port }),
          ...(lock ? { lockMs: Number(lock) } : {}),
        });
        // Stop signals are ours before the ready line is written: stdout is a pipe, written
        // synchronously, so whoever reads that line may signal before the next statement runs
        // (watched under load: a SIGHUP right after the line killed the worker, no stop logged).
        // A signal during start-up stops it once started.
        let signalled = false;
        const stopped = new Promise<void>((resolve) => {
          const stop = (signal: string) => {
            signalled = true;
            // Graceful: no new jobs, the running ones finish (a second signal does not wait).
            void starting
              .then(
                (running) => {
                  logger.info({ signal, running: running.worker.running }, 'worker stopping');
                  return running.close();
                },
                () => {},
              )
              .then(resolve, resolve);
          };
          onStopSignals(stop, (signal) => {
            logger.warn({ signal }, 'second signal: not waiting for the running jobs');
            resolve();
          });
        });
        const running = await starting;
        if (!signalled) {
          process.stdout.write(
            `${JSON.stringify({ url: running.url, worker: running.worker.id, concurrency })}\n`,
          );
        }
        await stopped;
        await new Promise<void>((resolve) => logger.flush(() => resolve()));
      },
    );
}
