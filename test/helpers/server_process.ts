import { type ChildProcess, spawn } from 'node:child_process';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import type { Redis } from 'ioredis';

// The reference server and CLI as child processes, started the way a user starts them
// (`viewer-cache --json serve`, `viewer-cache token create …`), and a small HTTP client.

export const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const MAIN = join(ROOT, 'src/server/main.ts');

export interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
}

/**
 * The environment of a server under test: the caller's, minus every VIEWER_CACHE_* and colour
 * setting that could leak in from the shell, plus `env`.
 */
export function serverEnv(env: Record<string, string>): NodeJS.ProcessEnv {
  const inherited: NodeJS.ProcessEnv = { ...process.env };
  for (const name of Object.keys(inherited)) {
    if (name.startsWith('VIEWER_CACHE_') || name === 'REDIS_CLUSTER' || name === 'FORCE_COLOR')
      delete inherited[name];
  }
  return { ...inherited, LOG_FORMAT: 'json', NO_COLOR: '1', ...env };
}

/** `viewer-cache --json serve` in a child process, its output kept in memory line by line. */
export class ServerProcess {
  readonly lines: string[] = [];
  stderr = '';
  readonly closed: Promise<Exit>;
  /** The ready line's content, once the server listens. */
  readonly ready: Promise<{ url: string; tokens?: Record<string, string> }>;
  readonly #child: ChildProcess;

  constructor(env: NodeJS.ProcessEnv, args: string[] = [], command = 'serve') {
    this.#child = spawn(process.execPath, ['--import', 'tsx', MAIN, '--json', command, ...args], {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    this.#child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
      this.stderr += chunk;
    });
    // 'close' comes after both output streams ended, so every line has been read by then.
    this.closed = new Promise((resolve) =>
      this.#child.once('close', (code, signal) => resolve({ code, signal })),
    );
    this.ready = new Promise((resolve, reject) => {
      createInterface({ input: this.#child.stdout! }).on('line', (line) => {
        this.lines.push(line);
        const parsed = parseJson(line);
        if (isRecord(parsed) && typeof parsed['url'] === 'string' && !('level' in parsed)) {
          resolve(parsed as { url: string });
        }
      });
      void this.closed.then(({ code, signal }) =>
        reject(
          new Error(
            `the server exited (code ${code}, signal ${signal}) before it was ready\n` +
              `stderr:\n${this.stderr}\nstdout (last lines):\n${this.lines.slice(-20).join('\n')}`,
          ),
        ),
      );
    });
    this.ready.catch(() => {});
  }

  /** The server's process id (it is spawned directly: no shell in between). */
  get pid(): number | undefined {
    return this.#child.pid;
  }

  get running(): boolean {
    return this.#child.exitCode === null && this.#child.signalCode === null;
  }

  signal(signal: NodeJS.Signals): void {
    if (this.running) this.#child.kill(signal);
  }

  /** Kills the server (if still running) and waits for it to exit. */
  async kill(): Promise<void> {
    this.signal('SIGKILL');
    await this.closed;
  }
}

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/** Runs the CLI (`viewer-cache ARGS`) as a user would, with `env`. */
export function runCli(env: NodeJS.ProcessEnv, args: string[]): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', MAIN, ...args], {
      cwd: ROOT,
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
      stdout += chunk;
    });
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      stderr += chunk;
    });
    child.once('error', reject);
    child.once('close', (code) => resolve({ code, stdout, stderr }));
  });
}

/** The CLI with `--json`, expected to succeed; its stdout parsed. */
export async function runCliJson<T>(env: NodeJS.ProcessEnv, args: string[]): Promise<T> {
  const result = await runCli(env, ['--json', ...args]);
  if (result.code !== 0) {
    throw new Error(`viewer-cache ${args.join(' ')} exited ${result.code}: ${result.stderr}`);
  }
  return JSON.parse(result.stdout) as T;
}

export interface Answer {
  status: number;
  headers: Headers;
  text: string;
  json: unknown;
}

export interface RequestOptions {
  token?: string;
  body?: unknown;
  raw?: string;
  contentType?: string;
  /** More request headers. */
  headers?: Record<string, string>;
}

/** One HTTP request to `baseUrl`, its body read as text and (when it is) JSON. */
export async function httpRequest(
  baseUrl: string,
  method: 'GET' | 'POST' | 'HEAD',
  path: string,
  options: RequestOptions = {},
): Promise<Answer> {
  const headers: Record<string, string> = { ...options.headers };
  if (options.token !== undefined) headers['authorization'] = `Bearer ${options.token}`;
  let body: string | undefined;
  if (options.raw !== undefined || options.body !== undefined) {
    body = options.raw ?? JSON.stringify(options.body);
    headers['content-type'] = options.contentType ?? 'application/json';
  }
  const response = await fetch(`${baseUrl}${path}`, {
    method,
    headers,
    ...(body === undefined ? {} : { body }),
  });
  const text = await response.text();
  return { status: response.status, headers: response.headers, text, json: parseJson(text) };
}

export interface RunAnswer extends Answer {
  fromCache: boolean | undefined;
  result: unknown;
  /** The response bytes from `"result":` on: equal for a hit and the miss it repeats. */
  resultBytes: string;
}

export function asRun(answer: Answer): RunAnswer {
  const body = isRecord(answer.json) ? answer.json : {};
  const at = answer.text.indexOf(',"result":');
  return {
    ...answer,
    fromCache: typeof body['fromCache'] === 'boolean' ? body['fromCache'] : undefined,
    result: body['result'],
    resultBytes: at < 0 ? '' : answer.text.slice(at),
  };
}

/** The value of an unlabelled sample, or of the first sample whose labels contain `labels`. */
export function sample(metrics: string, name: string, labels = ''): number {
  for (const line of metrics.split('\n')) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (labels === '' ? !rest.startsWith(' ') : !(rest.startsWith('{') && rest.includes(labels)))
      continue;
    return Number(rest.slice(rest.lastIndexOf(' ') + 1));
  }
  return Number.NaN;
}

/** Deletes every key under `prefix` (suites share one Redis). */
export async function clearRedisPrefix(redis: Redis, prefix: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
    if (keys.length > 0) await redis.del(...keys);
    cursor = next;
  } while (cursor !== '0');
}

/** Polls `check` until it returns true or `deadlineMs` passes; resolves to the time it took. */
export async function pollUntil(
  check: () => Promise<boolean>,
  deadlineMs: number,
  everyMs = 25,
): Promise<number> {
  const started = performance.now();
  for (;;) {
    if (await check()) return performance.now() - started;
    if (performance.now() - started > deadlineMs) {
      throw new Error(`condition not met within ${deadlineMs} ms`);
    }
    await new Promise((resolve) => setTimeout(resolve, everyMs));
  }
}

export function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
}

export function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}
