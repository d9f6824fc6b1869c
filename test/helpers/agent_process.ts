import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { ROOT, serverEnv } from './server_process.js';

const MAIN = join(ROOT, 'src/server/main.ts');

/** `viewer-cache worker --agent --demo` with exactly the agent's variables. */
export class AgentProcess {
  readonly lines: string[] = [];
  stderr = '';
  readonly closed: Promise<number | null>;
  readonly #child: ChildProcess;
  constructor(
    vars: Record<string, string | undefined>,
    rolePrefix: string,
    /** More arguments of `worker`, e.g. `['--concurrency', '2']`. */
    args: string[] = [],
  ) {
    const base = serverEnv({});
    // Nothing of the server's configuration: only what any process needs, and the agent's own.
    const own: NodeJS.ProcessEnv = {
      PATH: base['PATH'],
      HOME: base['HOME'],
      LOG_FORMAT: 'json',
      NO_COLOR: '1',
      VIEWER_CACHE_DEMO_ROLE_PREFIX: rolePrefix,
      ...vars,
    };
    this.#child = spawn(
      process.execPath,
      // `--apps PATH` in `args` runs that module instead of the demo's.
      [
        '--import',
        'tsx',
        MAIN,
        'worker',
        '--agent',
        ...(args.includes('--apps') ? [] : ['--demo']),
        ...args,
      ],
      {
        cwd: ROOT,
        env: own,
        stdio: ['ignore', 'pipe', 'pipe'],
      },
    );
    this.#child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr += chunk;
    });
    createInterface({ input: this.#child.stdout! }).on('line', (line) => this.lines.push(line));
    this.closed = new Promise((resolve) => this.#child.once('close', (code) => resolve(code)));
  }
  signal(signal: NodeJS.Signals) {
    if (this.#child.exitCode === null) this.#child.kill(signal);
  }
  /** Paths of the jobs it finished, from its log lines. */
  finished(): { path: string; code: string }[] {
    return this.lines
      .map((line) => JSON.parse(line) as { msg?: string; path?: string; code?: string })
      .filter((l) => l.msg === 'job finished')
      .map((l) => ({ path: l.path!, code: l.code! }));
  }
}
