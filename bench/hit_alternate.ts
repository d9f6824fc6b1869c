/**
 * `npx tsx bench/hit_alternate.ts [bytes=65536] [--which raw,direct,store,hit] [--rounds 12]
 * [--callers 64]`: hits at 64 concurrent callers (or `--callers`), the kinds alternating in
 * 500 ms rounds in this one process (each round's order the reverse of the last), with ops/s
 * and CPU µs per op summed over the rounds:
 * - `raw`: the shared client's `getBuffer` of the entry (the 64-caller rows' baseline);
 * - `store`: `RedisCacheStore.get` of the same entry (its key derived beforehand);
 * - `hit`: the unsealed `withResultCache` hit, `json()` bytes (`redis_hit`);
 * - `keyed`: `raw` with the key derived per op (`redis_keyed_get`, the keyed floor);
 * - `sealed`, `floor`: the sealed hit (`redis_hit_sealed`) and its floor (`sealed_floor`);
 * - `direct`: the store's way of sending a GET without the store (an ioredis `Command` built and
 *   sent directly, the key prefixed beforehand): a control that costs what `raw` costs, so what
 *   it reads against `raw` is the harness's own noise.
 *
 * Why: `profile_hit.ts` runs one kind per process, and at 64 KiB two processes running the same
 * code differ by more than the kinds do (raw `GET` 8.4 k–9.2 k/s; the store read 0.84–0.88× it
 * in four processes, 2026-12-07). Alternated in one process they share the swings, and still a
 * round's ratio ranges widely (0.55–1.66 for `direct` against `raw`), and the control read
 * 0.94× and 1.05× `raw` in two runs of 12 rounds: a difference of a few percent at 64 KiB needs
 * many rounds to be seen. Needs Redis at `REDIS_URL`; writes under `vc-bench:<pid>:` and
 * deletes it at the end.
 */
import { Command } from 'ioredis';
import { cachedResultPath, RedisCacheStore, withResultCache } from '../src/index.js';
import {
  deleteRunKeys,
  GuardedExecutor,
  RUN_PREFIX,
  sharedRedis,
  sizeFixture,
} from './fixtures.js';
import { fmt, markdownTable } from './helpers.js';
import { sealedFloor } from './sealed_floor.js';

/** A fixed bench secret (never a real one). */
const BENCH_SECRET = 'bench-only secret, 32 bytes or more, not for use';
const ROUND_MS = 500;
const argv = process.argv.slice(2);
const option = (name: string) => {
  const at = argv.indexOf(`--${name}`);
  return at === -1 ? undefined : argv[at + 1];
};
const bytes = Number(argv.find((a) => /^\d+$/.test(a)) ?? 65536);
const rounds = Number(option('rounds') ?? 12);
const CALLERS = Number(option('callers') ?? 64);
const which = (option('which') ?? 'raw,direct,store,hit').split(',');

const fx = sizeFixture(bytes);
const redis = sharedRedis();
const prefix = `${RUN_PREFIX}alt:`;
const store = new RedisCacheStore({ redis, prefix, commandTimeout: '2s' });
const executor = new GuardedExecutor('hit_alternate', fx.json);
const cached = withResultCache(executor, { store, seal: false });
for (const job of fx.jobs) await cached.run(job);
// Sealed: the hit with `seal` (`redis_hit_sealed`) and its floor (`sealed_floor`: HMAC,
// `getBuffer`, AES-256-GCM open), each reading entries of its own.
const sealedStore = new RedisCacheStore({ redis, prefix: `${prefix}s:`, commandTimeout: '2s' });
const sealed = withResultCache(executor, { store: sealedStore, seal: { secretKey: BENCH_SECRET } });
for (const job of fx.jobs) await sealed.run(job);
const floor = (await sealedFloor(fx, redis)).scenarios[0]!;
executor.arm();
const keys = fx.jobs.map((job) => cachedResultPath(job));
const prefixed = keys.map((key) => prefix + key);
const n = keys.length;

const kinds: Record<string, (i: number) => Promise<unknown>> = {
  raw: (i) => redis.getBuffer(prefixed[i % n]!),
  store: (i) => store.get(keys[i % n]!),
  hit: async (i) => (await cached.run(fx.jobs[i % n]!)).json(),
  keyed: (i) => redis.getBuffer(prefix + cachedResultPath(fx.jobs[i % n]!)),
  sealed: async (i) => (await sealed.run(fx.jobs[i % n]!)).json(),
  floor: (i) => floor.op(i) as Promise<unknown>,
  direct: (i) => {
    const command = new Command('get', [prefixed[i % n]!], { replyEncoding: null });
    redis.sendCommand(command);
    return command.promise;
  },
};
for (const kind of which) {
  if (kinds[kind] === undefined)
    throw new Error(`--which takes ${Object.keys(kinds).join(', ')} (got ${kind})`);
}

async function round(op: (i: number) => Promise<unknown>, ms: number) {
  let ops = 0;
  const until = Date.now() + ms;
  const cpu0 = process.cpuUsage();
  const t0 = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: CALLERS }, async (_, c) => {
      for (let i = c; Date.now() < until; i += CALLERS) {
        await op(i);
        ops++;
      }
    }),
  );
  const cpu = process.cpuUsage(cpu0);
  return { ops, ns: Number(process.hrtime.bigint() - t0), cpuUs: cpu.user + cpu.system };
}

const sum = new Map(
  which.map((kind) => [kind, { ops: 0, ns: 0, cpuUs: 0, perRound: [] as number[] }]),
);
for (const kind of which) await round(kinds[kind]!, ROUND_MS / 2);
for (let r = 0; r < rounds; r++) {
  for (const kind of r % 2 === 0 ? which : [...which].reverse()) {
    const got = await round(kinds[kind]!, ROUND_MS);
    const s = sum.get(kind)!;
    s.ops += got.ops;
    s.ns += got.ns;
    s.cpuUs += got.cpuUs;
    s.perRound.push((got.ops * 1e9) / got.ns);
  }
}
const base = sum.get(which[0]!)!;
console.log(
  `${fx.label}, ${CALLERS} callers, ${rounds} alternating rounds of ${ROUND_MS} ms per kind (one process)\n`,
);
console.log(
  markdownTable(
    ['kind', 'ops/s', `÷ ${which[0]}`, 'per-round ratio (min–max)', 'CPU µs/op'],
    which.map((kind) => {
      const s = sum.get(kind)!;
      const ratios = s.perRound.map((v, i) => v / base.perRound[i]!);
      return [
        kind,
        fmt((s.ops * 1e9) / s.ns, 0),
        fmt((s.ops * 1e9) / s.ns / ((base.ops * 1e9) / base.ns), 2),
        `${fmt(Math.min(...ratios), 2)}–${fmt(Math.max(...ratios), 2)}`,
        fmt(s.cpuUs / s.ops, 1),
      ];
    }),
  ),
);
await deleteRunKeys(redis);
redis.disconnect();
process.exit(0);
