// What a job-token child of a queued job costs now that it runs on a worker (one queue deeper)
// instead of on the server in process: two deployments side by side on the same Redis and
// PostgreSQL — this checkout, and a baseline checkout given as BASELINE_ROOT (e.g. main's tree
// with node_modules linked) — each a `serve --demo --execution queue` and one `worker --demo`
// (concurrency 1), memory tier off. Interleaved rounds, each first deleting the deployment's
// cache entries so the child is a miss, then `f/orders/remote_child` as carol (parent queued,
// child over HTTP), and a bare queued miss (`f/orders/list`) for scale. Medians and ranges.
//
//   BASELINE_ROOT=/tmp/base DATABASE_URL=postgres://… REDIS_URL=redis://… npx tsx bench/child_runs.ts
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { loadavg } from 'node:os';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { Redis } from 'ioredis';
import pg from 'pg';
import { demoToken } from '../src/server/credentials/tokens.js';

const ROOT = fileURLToPath(new URL('../', import.meta.url));
const BASELINE = process.env['BASELINE_ROOT'] ?? '';
const DATABASE_URL = process.env['DATABASE_URL'] ?? '';
const REDIS_URL = process.env['REDIS_URL'] ?? 'redis://127.0.0.1:6379';
const ROUNDS = Number(process.env['ROUNDS'] ?? '40');
const SECRET = randomBytes(32).toString('hex');
if (BASELINE === '' || DATABASE_URL === '') throw new Error('give BASELINE_ROOT and DATABASE_URL');

const children: ChildProcess[] = [];
const databases: string[] = [];
function start(root: string, env: NodeJS.ProcessEnv, command: string, args: string[] = []) {
  const child = spawn(
    process.execPath,
    ['--import', 'tsx', 'src/server/main.ts', '--json', command, ...args],
    {
      cwd: root,
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  children.push(child);
  return new Promise<string>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      try {
        const parsed = JSON.parse(line) as Record<string, unknown>;
        if (typeof parsed['url'] === 'string' && !('level' in parsed)) resolve(parsed['url']);
      } catch {}
    });
    child.once('exit', (code) => reject(new Error(`${command} exited ${code}`)));
  });
}

async function deployment(label: string, root: string) {
  const tag = `vcb${randomBytes(3).toString('hex')}`;
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  await admin.query(`create database ${tag}`);
  databases.push(tag);
  await admin.end();
  const url = new URL(DATABASE_URL);
  url.pathname = `/${tag}`;
  const cachePrefix = `vc-bench:${tag}:`;
  const env = {
    DATABASE_URL: url.href,
    REDIS_URL,
    VIEWER_CACHE_REDIS_PREFIX: cachePrefix,
    VIEWER_CACHE_REDIS_TIMEOUT_MS: '5000',
    VIEWER_CACHE_MEMORY_TIER_BYTES: '0',
    VIEWER_CACHE_SECRET_KEY: SECRET,
    VIEWER_CACHE_DEMO: 'true',
    VIEWER_CACHE_DEMO_ROLE_PREFIX: tag,
    VIEWER_CACHE_SCHEDULE_MS: '86400000',
    VIEWER_CACHE_EXECUTION: 'queue',
    VIEWER_CACHE_QUEUE_PREFIX: `{${tag}q}`,
    HOST: '127.0.0.1',
    PORT: '0',
    LOG_LEVEL: 'warn',
  };
  const base = await start(root, env, 'serve');
  // The baseline worker needs the address (it had no other way); this checkout's does not.
  const workerEnv = root === BASELINE ? { ...env, VIEWER_CACHE_SERVER_URL: base } : env;
  await start(root, workerEnv, 'worker', ['--port', '0']);
  return { label, base, cachePrefix, tag };
}

const redis = new Redis(REDIS_URL);
async function clear(prefix: string) {
  let cursor = '0';
  do {
    const [next, keys] = await redis.scan(cursor, 'MATCH', `${prefix}*`, 'COUNT', 500);
    if (keys.length > 0) await redis.del(...keys);
    cursor = next;
  } while (cursor !== '0');
}

async function timed(base: string, path: string): Promise<number> {
  const started = performance.now();
  const response = await fetch(new URL('/api/w/demo/apps/orders-dashboard/run', base), {
    method: 'POST',
    headers: {
      authorization: `Bearer ${demoToken(SECRET, 'carol@example.com')}`,
      'content-type': 'application/json',
    },
    body: JSON.stringify({ path }),
  });
  const body = (await response.json()) as { fromCache?: boolean };
  const ms = performance.now() - started;
  if (response.status !== 200 || body.fromCache !== false)
    throw new Error(`${path}: ${response.status} ${JSON.stringify(body).slice(0, 200)}`);
  return ms;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const range = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return `${s[Math.floor(s.length * 0.1)]!.toFixed(2)}–${s[Math.floor(s.length * 0.9)]!.toFixed(2)}`;
};

try {
  const load = loadavg()[0]!.toFixed(2);
  const now = await deployment('this checkout (child on a worker)', ROOT);
  const before = await deployment('baseline (child on the server)', BASELINE);
  const samples = new Map<string, number[]>();
  const add = (key: string, ms: number) => samples.set(key, [...(samples.get(key) ?? []), ms]);
  for (let round = -3; round < ROUNDS; round++) {
    for (const d of round % 2 === 0 ? [now, before] : [before, now]) {
      await clear(d.cachePrefix);
      const child = await timed(d.base, 'f/orders/remote_child');
      await clear(d.cachePrefix);
      const bare = await timed(d.base, 'f/orders/list');
      if (round >= 0) {
        add(`${d.label}: remote_child, child a miss`, child);
        add(`${d.label}: bare queued miss`, bare);
      }
    }
  }
  console.log(`rounds ${ROUNDS}, load average at start ${load} (2 cores, shared)`);
  for (const [key, xs] of samples)
    console.log(`${key}: p50 ${median(xs).toFixed(2)} ms (p10–p90 ${range(xs)})`);
  const ratio = (a: string, b: string) => median(samples.get(a)!) / median(samples.get(b)!);
  console.log(
    `remote_child p50, now / baseline: ${ratio(`${now.label}: remote_child, child a miss`, `${before.label}: remote_child, child a miss`).toFixed(2)}`,
  );
} finally {
  await Promise.all(
    children.map(
      (child) =>
        new Promise((resolve) => {
          if (child.exitCode !== null) return resolve(null);
          child.once('exit', resolve);
          child.kill('SIGTERM');
        }),
    ),
  );
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  for (const tag of databases) await admin.query(`drop database if exists ${tag} with (force)`);
  await admin.end();
  redis.disconnect();
}
