import { type ChildProcess, spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import type { Datatables } from '../../../src/datatable/datatables.js';
import { fleetKey, fleetMember } from '../../../src/queue/queue_names.js';
import { freePort } from '../../helpers/free_port.js';
import { app, type OrdersDb, ordersDb, ROWS, runFor, SECRET_KEY } from '../../helpers/orders_db.js';
import { QueueDeployment } from '../../helpers/queue_fixture.js';
import { SLOW_RUNNABLES } from '../../helpers/queue_slow_runnables.js';
import { ROOT } from '../../helpers/server_process.js';
import { waitUntil } from '../../helpers/wait.js';

// Jobs on workers with real processes: a worker killed mid-job (retried once on the same
// record, so the same viewer; a second loss is a coded failure), a server that gave up waiting,
// and a Redis restart (a private redis-server of this file).

const ALICE = 'alice@example.com';
const LOCK_MS = 1500;

let fx: OrdersDb;
let datatables: Datatables;
const deployments: QueueDeployment[] = [];
const children: ChildProcess[] = [];

/** A worker process (queue_worker_main.ts); its stdout lines, parsed, kept in `lines`. */
async function workerProcess(deploy: QueueDeployment) {
  const lines: Record<string, unknown>[] = [];
  const child = spawn(process.execPath, ['--import', 'tsx', 'test/helpers/queue_worker_main.ts'], {
    cwd: ROOT,
    env: {
      ...process.env,
      DATABASE_URL: fx.db.url,
      REDIS_URL: deploy.redisUrl,
      QUEUE_PREFIX: deploy.prefix,
      CACHE_PREFIX: deploy.cachePrefix,
      SECRET_KEY,
      LOCK_MS: String(LOCK_MS),
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  children.push(child);
  let stderr = '';
  child.stderr!.setEncoding('utf8').on('data', (chunk: string) => {
    stderr += chunk;
  });
  createInterface({ input: child.stdout! }).on('line', (line) => {
    try {
      lines.push(JSON.parse(line) as Record<string, unknown>);
    } catch {
      // not ours
    }
  });
  await waitUntil(
    'the worker process is ready',
    () => {
      if (child.exitCode !== null) throw new Error(`worker exited: ${stderr}`);
      return lines.some((l) => l['url'] === 'ready');
    },
    30_000,
  );
  const kill = async () => {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await once(child, 'close');
    }
  };
  return { child, lines, kill };
}

beforeAll(async () => {
  fx = await ordersDb();
  datatables = await fx.open({ migrate: false });
  const first = new QueueDeployment(inject('redisUrl'), fx.db.url, datatables, SLOW_RUNNABLES);
  deployments.push(first);
  await first.migrate();
});

afterEach(async () => {
  for (const child of children.splice(0)) {
    if (child.exitCode === null && child.signalCode === null) {
      child.kill('SIGKILL');
      await once(child, 'close');
    }
  }
});

afterAll(async () => {
  for (const deploy of deployments) await deploy.close();
  await fx?.close();
});

function fresh(redisUrl = inject('redisUrl')): QueueDeployment {
  const deploy = new QueueDeployment(redisUrl, fx.db.url, datatables, SLOW_RUNNABLES);
  deployments.push(deploy);
  return deploy;
}

describe('a worker killed mid-job', () => {
  it('the job is retried once, on the same record: the same viewer answers', async () => {
    const deploy = fresh();
    const server = await deploy.server({ wait: 30_000 });
    const first = await workerProcess(deploy);
    const run = runFor(server.registry, 'slow', app(ALICE), {
      through: server.cached,
      args: { n: 1, ms: 2000 },
    });
    await waitUntil('the first worker started the job', () =>
      first.lines.some((l) => l['started'] === 1),
    );
    await first.kill();
    const second = await workerProcess(deploy);
    const result = await run;
    expect(result.value).toEqual(ROWS['emea']);
    expect(second.lines.some((l) => l['started'] === 1)).toBe(true);
  }, 60_000);

  it('killed twice: the run fails with a code, never runs a third time', async () => {
    const deploy = fresh();
    const server = await deploy.server({ wait: 30_000 });
    const run = runFor(server.registry, 'slow', app(ALICE), {
      through: server.cached,
      args: { n: 2, ms: 4000 },
    });
    run.catch(() => {});
    for (let i = 0; i < 2; i++) {
      const worker = await workerProcess(deploy);
      await waitUntil(
        'a worker started the job',
        () => worker.lines.some((l) => l['started'] === 2),
        20_000,
      );
      await worker.kill();
    }
    const third = await workerProcess(deploy);
    await expect(run).rejects.toMatchObject({
      code: expect.stringMatching(/^(E_QUEUE_WORKER_LOST|E_QUEUE_JOB_REFUSED)$/),
    });
    expect(third.lines.some((l) => l['started'] === 2)).toBe(false);
  }, 90_000);
});

describe('a server that gave up waiting', () => {
  it('answers E_QUEUE_TIMEOUT; a worker reaching the job later refuses it and nothing is cached', async () => {
    const deploy = fresh();
    const server = await deploy.server({ wait: 1000 });
    // A worker that is alive but never gets to the job (its heartbeat, nothing else): the
    // server enqueues (with no live worker at all it would fail E_NO_WORKERS instead).
    await deploy.redis.zadd(
      fleetKey(deploy.prefix, 'jobs'),
      Date.now(),
      fleetMember('demo', 'default', 'busy'),
    );
    const args = { n: 3, ms: 10 };
    await expect(
      runFor(server.registry, 'slow', app(ALICE), { through: server.cached, args }),
    ).rejects.toMatchObject({ code: 'E_QUEUE_TIMEOUT' });
    const late = await workerProcess(deploy);
    await waitUntil('the late worker answered', () => late.lines.some((l) => 'finished' in l));
    expect(late.lines.find((l) => 'finished' in l)?.['finished']).toBe('E_QUEUE_JOB_REFUSED');
    expect(late.lines.some((l) => l['started'] === 3)).toBe(false);
    // Nothing was stored: with time to wait, the same run executes (a miss, not a hit).
    const patient = await deploy.server({ wait: 30_000 });
    const result = await runFor(patient.registry, 'slow', app(ALICE), {
      through: patient.cached,
      args,
    });
    expect(result.fromCache).toBe(false);
    expect(result.value).toEqual(ROWS['emea']);
  }, 60_000);
});

describe('a Redis restart', () => {
  let redisServer: ChildProcess | undefined;
  let port = 0;
  const startRedis = async () => {
    const found = spawnSync('sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' });
    if (found.status !== 0)
      throw new Error('redis-server is required (apt-get install redis-server)');
    redisServer = spawn(
      found.stdout.trim(),
      ['--port', String(port), '--save', '', '--appendonly', 'no'],
      {
        stdio: 'ignore',
      },
    );
    const probe = fresh(`redis://127.0.0.1:${port}`);
    deployments.pop();
    await waitUntil(
      'the private redis answers',
      async () => (await probe.redis.ping().catch(() => '')) === 'PONG',
    );
    probe.redis.disconnect();
    await probe.pool.end();
  };
  afterAll(() => {
    redisServer?.kill('SIGKILL');
  });

  it('runs fail with a code while it is down, and the same server and worker serve after', async () => {
    port = await freePort();
    await startRedis();
    const deploy = fresh(`redis://127.0.0.1:${port}`);
    const server = await deploy.server({ wait: 20_000 });
    await workerProcess(deploy);
    const before = await runFor(server.registry, 'slow', app(ALICE), {
      through: server.cached,
      args: { n: 4, ms: 10 },
    });
    expect(before.value).toEqual(ROWS['emea']);
    redisServer!.kill('SIGKILL');
    await once(redisServer!, 'close');
    const started = Date.now();
    await expect(
      runFor(server.registry, 'slow', app(ALICE), {
        through: server.cached,
        args: { n: 5, ms: 10 },
      }),
    ).rejects.toMatchObject({ code: expect.stringMatching(/^E_QUEUE_(UNAVAILABLE|TIMEOUT)$/) });
    expect(Date.now() - started).toBeLessThan(15_000);
    await startRedis();
    let after: unknown;
    await waitUntil(
      'a run succeeds after the restart',
      async () => {
        try {
          after = (
            await runFor(server.registry, 'slow', app(ALICE), {
              through: server.cached,
              args: { n: 6, ms: 10 },
            })
          ).value;
          return true;
        } catch {
          return false;
        }
      },
      30_000,
    );
    expect(after).toEqual(ROWS['emea']);
  }, 90_000);

  it('a worker stopping while Redis is gone stops within about a lock duration instead of waiting for it', async () => {
    redisServer?.kill('SIGKILL');
    port = await freePort();
    await startRedis();
    const deploy = fresh(`redis://127.0.0.1:${port}`);
    const server = await deploy.server({ wait: 20_000 });
    const worker = await deploy.worker({ lockDuration: LOCK_MS });
    const run = runFor(server.registry, 'slow', app(ALICE), {
      through: server.cached,
      args: { n: 7, ms: 4000 },
    });
    run.catch(() => {});
    await waitUntil('the worker holds the job', () => worker.running === 1);
    redisServer!.kill('SIGKILL');
    await once(redisServer!, 'close');
    // Graceful first: BullMQ waits for the job, whose completion it can never report. Bounded
    // by the lock duration of unreachable Redis, then the sockets are dropped (watched: without
    // the bound, close() had not resolved when the 20 s below ran out).
    const started = performance.now();
    const closed = await Promise.race([
      worker.close().then(() => 'closed'),
      new Promise((resolve) => setTimeout(resolve, 20_000, 'still waiting')),
    ]);
    expect(closed).toBe('closed');
    expect(performance.now() - started).toBeLessThan(LOCK_MS + 2 * 2000 + 2000);
    // Back, so the file's clean-up finds a Redis rather than waiting out its bounds.
    await startRedis();
  }, 60_000);
});
