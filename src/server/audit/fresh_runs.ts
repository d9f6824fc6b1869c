import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { AuditRun, RunOutcome } from './run_outcome.js';

/** What a fresh process is asked (on its stdin). */
export interface FreshRunRequest {
  readonly appsSource: string;
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly databaseUrl: string;
  readonly secretKey: string;
  readonly runs: readonly AuditRun[];
}

/** The child's entry, beside this file: `.ts` under tsx (tests, `npm run cli`), else `.js`. */
const CHILD = new URL(
  `./fresh_run_child${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`,
  import.meta.url,
);

/**
 * Runs `request.runs` with no cache in a new Node process (see fresh_run_child.ts), within
 * `timeoutMs`; the child is killed past it.
 * @throws {Error} when the child fails or prints no outcomes.
 */
export function freshRuns(request: FreshRunRequest, timeoutMs: number): Promise<RunOutcome[]> {
  const file = fileURLToPath(CHILD);
  const args = file.endsWith('.ts') ? ['--import', 'tsx', file] : [file];
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, {
      stdio: ['pipe', 'pipe', 'pipe'],
      env: { ...process.env, ...request.env } as NodeJS.ProcessEnv,
    });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on('data', (chunk: Buffer) => out.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => err.push(chunk));
    // A child gone before reading its stdin: the write fails, the exit below reports it.
    child.stdin.on('error', () => {});
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const text = Buffer.concat(out).toString('utf8').trim();
      if (code === 0 && text !== '') {
        try {
          resolve(JSON.parse(text.split('\n').at(-1)!) as RunOutcome[]);
          return;
        } catch {}
      }
      const why = signal === 'SIGKILL' ? `no answer within ${timeoutMs} ms` : `exit ${code}`;
      reject(
        new Error(
          `a fresh run process failed (${why}): ${Buffer.concat(err).toString('utf8').trim().slice(-500)}`,
        ),
      );
    });
    child.stdin.end(JSON.stringify(request));
  });
}
