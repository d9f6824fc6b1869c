/*
 * A fresh process for one viewer of `viewer-cache audit`: loads the apps module anew, runs each
 * audited runnable once with no cache, prints the outcomes as one JSON line, exits. Module-level
 * state of a runnable (a memoised query), or a cache of the user's own, starts empty here, so
 * what it prints is this viewer's own answer. The request (with the secret key) comes on stdin,
 * never in argv, which other users of the machine can read.
 */
import { createDatatables, createExecutor } from '../../index.js';
import { loadApps } from '../demo/demo_apps.js';
import type { FreshRunRequest } from './fresh_runs.js';
import { type RunOutcome, runOutcome } from './run_outcome.js';

async function main(): Promise<void> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  const request = JSON.parse(Buffer.concat(chunks).toString('utf8')) as FreshRunRequest;
  const apps = await loadApps(request.appsSource, {
    childRunUrl: () => {
      throw new TypeError('the audit starts no server: a child run over HTTP is not audited');
    },
    env: request.env,
  });
  const datatables = await createDatatables({
    connection: request.databaseUrl,
    secretKey: request.secretKey,
    pools: { prepareAhead: false },
  });
  try {
    const executor = createExecutor({ runnables: apps.runnables, datatables });
    const outcomes: RunOutcome[] = [];
    for (const run of request.runs) outcomes.push(await runOutcome(executor, executor, run));
    process.stdout.write(`${JSON.stringify(outcomes)}\n`);
  } finally {
    await datatables.close();
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  },
);
