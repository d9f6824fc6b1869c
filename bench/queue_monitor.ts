/**
 * The Redis commands of one queued miss, in order and by connection: `npx tsx
 * bench/queue_monitor.ts [misses=3]`. Starts a private `redis-server`, a server side (queue
 * executor under a sealed result cache) and a worker wired as `viewer-cache worker` wires it
 * (result cache, shared job tokens) in this process, warms them, then prints what `MONITOR`
 * saw during a few sequential misses, each line with its time since the miss began and the
 * connection that sent it — beside a bare BullMQ round trip seen the same way. Commands run
 * inside a script are indented under it. A tool for reading the critical path, not a timing.
 */
import { randomBytes } from 'node:crypto';
import { Redis } from 'ioredis';
import {
  createExecutor,
  createQueueWorker,
  RedisCacheStore,
  SharedJobTokens,
  withResultCache,
} from '../src/index.js';
import { bareBullmq, privateRedis } from './private_redis.js';
import { benchQueueExecutor } from './queue_floor.js';
import { QUEUE_BENCH_RUNNABLES, QUEUE_BENCH_SECRET } from './queue_runnables.js';

const MISSES = Number(process.argv[2] ?? '3');
const tag = randomBytes(4).toString('hex');
const ORIGIN = { kind: 'app', session: { email: 'bench@example.com' } } as const;

interface Seen {
  readonly at: number;
  readonly client: string;
  readonly text: string;
  readonly inScript: boolean;
}

/** MONITOR lines between `start()` and `stop()`. */
async function monitor(url: string) {
  const client = new Redis(url);
  const lines: Seen[] = [];
  let on = false;
  const m = await client.monitor();
  m.on('monitor', (time: string, args: string[], source: string) => {
    if (!on) return;
    const text = args
      .map((a) => (a.length > 40 ? `${a.slice(0, 37)}…` : a))
      .join(' ')
      .replace(/\s+/g, ' ');
    lines.push({
      at: Number(time) * 1000,
      client: source,
      text,
      inScript: source.startsWith('lua'),
    });
  });
  return {
    start() {
      lines.length = 0;
      on = true;
    },
    async stop(): Promise<Seen[]> {
      await new Promise((resolve) => setTimeout(resolve, 100));
      on = false;
      return [...lines];
    },
    close() {
      m.disconnect();
      client.disconnect();
    },
  };
}

function print(title: string, seen: Seen[]) {
  const names = new Map<string, string>();
  let t0 = seen[0]?.at ?? 0;
  process.stdout.write(`\n== ${title}\n`);
  let own = 0;
  let scripts = 0;
  for (const s of seen) {
    if (s.text.startsWith('"echo" "miss')) {
      t0 = s.at;
      process.stdout.write(`-- ${s.text}\n`);
      continue;
    }
    let name = s.inScript ? 'lua' : names.get(s.client);
    if (name === undefined) {
      name = `c${names.size + 1}`;
      names.set(s.client, name);
    }
    if (!s.inScript) own++;
    if (s.text.startsWith('"evalsha"')) scripts++;
    process.stdout.write(
      `${(s.at - t0).toFixed(3).padStart(8)} ms ${s.inScript ? '    ' : ''}${name.padEnd(4)} ${s.text}\n`,
    );
  }
  process.stdout.write(`   (${own} commands sent, ${scripts} of them scripts)\n`);
}

const { url, child } = await privateRedis();
const redis = new Redis(url, { maxRetriesPerRequest: null });
const marker = new Redis(url);
const closers: (() => Promise<unknown>)[] = [];
try {
  const prefix = `{vc-mon-${tag}}`;
  const seal = { secretKey: QUEUE_BENCH_SECRET };
  const store = () => {
    const s = new RedisCacheStore({ redis: url, prefix: `vc-mon:${tag}:` });
    closers.push(() => s.close());
    return s;
  };
  const { queue } = await benchQueueExecutor(redis, prefix);
  closers.push(() => queue.close());
  const queued = withResultCache(queue, { store: store(), seal });
  const worker = createQueueWorker({
    executor: withResultCache(
      createExecutor({
        runnables: QUEUE_BENCH_RUNNABLES,
        jobTokens: new SharedJobTokens({ redis, prefix, secretKey: QUEUE_BENCH_SECRET }),
      }),
      { store: store(), seal },
    ),
    workspaces: ['bench'],
    redis,
    secretKey: QUEUE_BENCH_SECRET,
    prefix,
    concurrency: 8,
  });
  closers.push(() => worker.close());
  await worker.ready();
  const miss = (i: number) =>
    queued.run(
      queue.createJob({
        workspace: 'bench',
        path: 'work',
        runAs: 'pub@example.com',
        origin: ORIGIN,
        args: { m: i },
      }),
    );
  for (let i = 0; i < 10; i++) await miss(-1 - i);
  const mon = await monitor(url);
  mon.start();
  for (let i = 0; i < MISSES; i++) {
    await marker.echo(`miss ${i}`);
    await miss(i);
  }
  print('queued miss', await mon.stop());

  const bare = await bareBullmq(redis, `{vc-monbare-${tag}}`);
  closers.push(() => bare.close());
  const roundTrip = bare.roundTrip;
  for (let i = 0; i < 10; i++) await roundTrip(-1 - i);
  mon.start();
  for (let i = 0; i < MISSES; i++) {
    await marker.echo(`miss ${i}`);
    await roundTrip(i);
  }
  print('bare BullMQ round trip', await mon.stop());
  mon.close();
} finally {
  for (const close of closers.reverse()) await close().catch(() => {});
  redis.disconnect();
  marker.disconnect();
  child.kill('SIGTERM');
}
process.exit(0);
