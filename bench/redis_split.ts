/**
 * `npx tsx bench/redis_split.ts [bytes=1024] [rounds=60]`: where a single caller's Redis hit
 * spends the time it takes over a raw GET. Each op is cut at two instants seen on the shared
 * client's socket: when the command is handed to the socket (`write`) and when its reply
 * arrives (the first `data` listener). So every op splits into
 *
 * - **before the write**: our work up to the command (job checks, key text, digest, store);
 * - **waiting**: the network and Redis, plus anything else the process did meanwhile;
 * - **after the reply**: parsing the reply and our work until the caller resumes.
 *
 * Five rows, interleaved in rounds like `npm run bench`: the raw `getBuffer`, the store's `get`
 * alone, the raw `getBuffer` with its key derived per op by `cachedResultPath` (the keyed
 * floor: what the viewer's key alone costs), `withResultCache` over a bare `getBuffer` store
 * (the cache layer without ours), and the full hit. What is left of the gap once the rows agree on "waiting" is our CPU, in µs.
 * The socket hooks cost every row alike; the figures are medians over all rounds.
 */
import type { Redis } from 'ioredis';
import { cachedResultPath, RedisCacheStore, withResultCache } from '../src/index.js';
import type { CacheStore } from '../src/stores/store.js';
import { deleteRunKeys, GuardedExecutor, sharedRedis, sizeFixture } from './fixtures.js';
import { fmt, markdownTable } from './helpers.js';
import { OURS_REDIS_PREFIX, redisHit } from './redis_hit.js';

const bytes = Number(process.argv[2] ?? 1024);
const rounds = Number(process.argv[3] ?? 60);
const OPS_PER_ROUND = 400;
const WARM_ROUNDS = 5;
const { hrtime } = process;

/** The last write handed to the socket and the last reply chunk read from it. */
function watchSocket(redis: Redis): { wrote: bigint; read: bigint } {
  const seen = { wrote: 0n, read: 0n };
  const stream = redis.stream;
  const write = stream.write.bind(stream) as (...args: unknown[]) => boolean;
  (stream as { write: (...args: unknown[]) => boolean }).write = (...args) => {
    seen.wrote = hrtime.bigint();
    return write(...args);
  };
  stream.prependListener('data', () => {
    seen.read = hrtime.bigint();
  });
  return seen;
}

const redis = sharedRedis();
const fx = sizeFixture(bytes);
const filled = await redisHit(fx, redis);
const store = new RedisCacheStore({ redis, prefix: OURS_REDIS_PREFIX, commandTimeout: '2s' });
const executor = new GuardedExecutor('redis_split', fx.json);
executor.arm();
const full = withResultCache(executor, { store, seal: false });
const bare: CacheStore = {
  get: (key) => redis.getBuffer(OURS_REDIS_PREFIX + key),
  set: async () => {},
  delete: async () => {},
};
const overBare = withResultCache(executor, { store: bare, seal: false });
const keys = fx.keys.map((key) => OURS_REDIS_PREFIX + key);
const n = keys.length;
const hit = async (run: Promise<{ fromCache: boolean }>) => {
  if (!(await run).fromCache) throw new Error('not a hit');
};
const rows: [string, string, (i: number) => Promise<unknown>][] = [
  ['raw', 'raw ioredis `getBuffer` (baseline)', (i) => redis.getBuffer(keys[i % n]!)],
  ['store', '`RedisCacheStore.get` alone', (i) => store.get(fx.keys[i % n]!)],
  [
    'keyed',
    'raw `getBuffer`, its key derived per op by `cachedResultPath` (the keyed floor)',
    (i) => redis.getBuffer(OURS_REDIS_PREFIX + cachedResultPath(fx.jobs[i % n]!)),
  ],
  [
    'cache_bare',
    '`withResultCache` hit over a bare `getBuffer` store',
    (i) => hit(overBare.run(fx.jobs[i % n]!)),
  ],
  [
    'hit',
    '`withResultCache` hit, `RedisCacheStore` (`redis_hit`)',
    (i) => hit(full.run(fx.jobs[i % n]!)),
  ],
];

const seen = watchSocket(redis);
const samples = new Map(
  rows.map(([id]) => [
    id,
    { total: [], before: [], waiting: [], after: [] } as Record<string, number[]>,
  ]),
);
let counter = 0;
for (let round = 0; round < WARM_ROUNDS + rounds; round++) {
  for (let k = 0; k < rows.length; k++) {
    const [id, , op] = rows[(k + round) % rows.length]!;
    const s = samples.get(id)!;
    for (let i = 0; i < OPS_PER_ROUND; i++) {
      const start = hrtime.bigint();
      await op(counter++);
      const end = hrtime.bigint();
      if (round < WARM_ROUNDS) continue;
      s['total']!.push(Number(end - start));
      s['before']!.push(Number(seen.wrote - start));
      s['waiting']!.push(Number(seen.read - seen.wrote));
      s['after']!.push(Number(end - seen.read));
    }
    await new Promise<void>((resolve) => setImmediate(resolve));
  }
}

const median = (values: number[]) => {
  const sorted = Float64Array.from(values).sort();
  return sorted[sorted.length >> 1]! / 1000;
};
const raw = samples.get('raw')!;
console.log(
  `${fx.label}, one caller, ${rounds} rounds × ${OPS_PER_ROUND} ops per row (medians, µs)\n`,
);
console.log(
  markdownTable(
    ['row', 'total µs', 'before the write µs', 'waiting µs', 'after the reply µs', '× raw'],
    rows.map(([id, label]) => {
      const s = samples.get(id)!;
      return [
        `\`${id}\` — ${label}`,
        fmt(median(s['total']!)),
        fmt(median(s['before']!)),
        fmt(median(s['waiting']!)),
        fmt(median(s['after']!)),
        fmt(median(s['total']!) / median(raw['total']!), 2),
      ];
    }),
  ),
);
await filled.close();
await store.close();
await deleteRunKeys(redis);
redis.disconnect();
