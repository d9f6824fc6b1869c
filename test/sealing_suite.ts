import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import type { CachedExecutor, CacheStore, JobResult, RejectionReason } from '../src/index.js';
import { cachedResultPath, withResultCache } from '../src/index.js';
import { CountingExecutor } from './helpers/counting_executor.js';
import { makeJob } from './helpers/jobs.js';

/** Direct access to what a store holds, as someone with access to Redis (not to the app) has. */
export interface RawAccess {
  /** Store keys (without any store prefix) written since the test began. */
  keys(): Promise<string[]>;
  get(key: string): Promise<Buffer | null>;
  set(key: string, value: Buffer): Promise<void>;
}

/** How the suite drives one store. */
export interface SealingTarget {
  /** A store (fresh or cleared) and raw access to the same data. */
  create(): Promise<{ store: CacheStore; raw: RawAccess }> | { store: CacheStore; raw: RawAccess };
  cleanup(): Promise<void>;
}

const alice = 'alice@example.com';
const bob = 'bob@example.com';
const args = { region: 'eu' };
const HOUR = 3_600_000;

/**
 * SPEC invariant 14: an entry opens only under its own key and secret. Every tampering below is
 * a miss counted as rejected, never a hit, and the run recomputes — on the real store.
 *
 * `sealed: false` runs the same attacks against an unsealed cache: every test must then fail
 * (checked once by hand; the attacks below are the ones that succeed without sealing).
 */
export function registerSealingSuite(name: string, target: SealingTarget, sealed = true): void {
  describe(`sealed entries (SPEC invariant 14): ${name}`, () => {
    const open: CachedExecutor[] = [];
    afterEach(async () => {
      for (const cache of open.splice(0)) expect(cache.inFlight).toBe(0);
      await target.cleanup();
    });

    async function setup(secret: string | null = 's'.repeat(32) + randomBytes(8).toString('hex')) {
      const { store, raw } = await target.create();
      const inner = new CountingExecutor((job) => ({
        viewer: job.perms.endUserEmail,
        rows: [{ patient: `record of ${job.perms.endUserEmail}` }],
      }));
      const seal =
        sealed && secret !== null ? { seal: { secretKey: secret } } : { seal: false as const };
      const cache = withResultCache(inner, { store, ...seal });
      open.push(cache);
      const rejected: RejectionReason[] = [];
      cache.events.on('cache:rejected', (e) => rejected.push(e.reason));
      /** Runs `viewer`'s job and returns the one store key it wrote. */
      const keyOf = async (viewer: string) => {
        const before = new Set(await raw.keys());
        await cache.run(job(viewer));
        const added = (await raw.keys()).filter((k) => !before.has(k));
        expect(added).toHaveLength(1);
        return added[0]!;
      };
      return { store, raw, inner, cache, rejected, keyOf, secret };
    }

    const job = (viewer: string) => makeJob({ viewer, args, cacheTtlS: 3600 });
    const viewerOf = (r: JobResult) => (r.value as { viewer: string }).viewer;

    /** The next run is a miss, counted as rejected, recomputed for `viewer`, then a hit again. */
    async function expectRejectedThenRecomputed(
      s: Awaited<ReturnType<typeof setup>>,
      viewer: string,
    ): Promise<void> {
      const calls = s.inner.calls;
      const rejectedBefore = s.cache.stats.rejected;
      const result = await s.cache.run(job(viewer));
      expect(result.fromCache).toBe(false);
      expect(viewerOf(result)).toBe(viewer);
      expect(s.inner.calls).toBe(calls + 1);
      expect(s.cache.stats.rejected).toBe(rejectedBefore + 1);
      expect(s.rejected.at(-1)).toBeDefined();
      const again = await s.cache.run(job(viewer));
      expect(again.fromCache).toBe(true);
      expect(viewerOf(again)).toBe(viewer);
    }

    it('a forged, well-formed envelope with fake rows and a long expiry is never served', async () => {
      const s = await setup();
      const key = await s.keyOf(alice);
      const forgedRows = Buffer.from(JSON.stringify({ viewer: alice, rows: [{ forged: true }] }));
      // What someone who can read key names and write values can build: an unsealed envelope
      // naming this key's digest (from its name), and a sealed-looking one with a made-up tag.
      const digest = Buffer.from(key.slice(key.lastIndexOf('/') + 1), 'hex');
      const plain = Buffer.alloc(48 + forgedRows.byteLength);
      plain.write('VC', 0, 'latin1');
      plain[2] = 2;
      plain.writeDoubleBE(Date.now() + 365 * 24 * HOUR, 4);
      plain.writeUInt32BE(forgedRows.byteLength, 12);
      digest.copy(plain, 16);
      forgedRows.copy(plain, 48);
      const sealedLooking = Buffer.concat([plain.subarray(0, 12), randomBytes(12), forgedRows]);
      sealedLooking[2] = 3;
      const tagged = Buffer.concat([sealedLooking, randomBytes(16)]);
      for (const forged of [plain, tagged]) {
        await s.raw.set(key, forged);
        await expectRejectedThenRecomputed(s, alice);
      }
    });

    it('a single bit flip anywhere in the entry is a miss, never a hit or broken bytes', async () => {
      const s = await setup();
      const key = await s.keyOf(alice);
      const entry = (await s.raw.get(key))!;
      // Every byte, a different bit each time: header, nonce, ciphertext and tag alike.
      for (let i = 0; i < entry.byteLength; i++) {
        const flipped = Buffer.from(entry);
        flipped[i]! ^= 1 << (i % 8);
        await s.raw.set(key, flipped);
        const result = await s.cache.run(job(alice));
        expect(result.fromCache).toBe(false);
        expect(viewerOf(result)).toBe(alice);
      }
      expect(s.cache.stats.rejected).toBe(entry.byteLength);
      expect(s.cache.stats.hits).toBe(0);
    });

    it('a truncated entry, at any length, is a miss', async () => {
      const s = await setup();
      const key = await s.keyOf(alice);
      const entry = (await s.raw.get(key))!;
      const lengths = [
        1,
        8,
        24,
        40,
        entry.byteLength - 17,
        entry.byteLength - 16,
        entry.byteLength - 1,
      ];
      for (const length of lengths) {
        const truncated = Buffer.from(entry.subarray(0, length));
        // An unsealed envelope states its payload length (bytes 12–16): make it agree.
        if (truncated[2] === 2 && length >= 48) truncated.writeUInt32BE(length - 48, 12);
        await s.raw.set(key, truncated);
        await expectRejectedThenRecomputed(s, alice);
      }
    });

    it("an entry moved to another viewer's key (digest rewritten to match) is a miss", async () => {
      const s = await setup();
      const bobsKey = await s.keyOf(bob);
      const alicesKey = await s.keyOf(alice);
      const moved = Buffer.from((await s.raw.get(bobsKey))!);
      // An unsealed envelope names its key's digest in bytes 16–48: rewrite it to the target's.
      if (moved[2] === 2) {
        Buffer.from(alicesKey.slice(alicesKey.lastIndexOf('/') + 1), 'hex').copy(moved, 16);
      }
      await s.raw.set(alicesKey, moved);
      await expectRejectedThenRecomputed(s, alice);
      expect(s.inner.callsFor(bob)).toBe(1);
    });

    it("an entry written under another deployment's secret is a miss", async () => {
      const theirs = await setup();
      const ours = await setup();
      const theirKey = await theirs.keyOf(alice);
      const ourKey = await ours.keyOf(alice);
      const entry = (await theirs.raw.get(theirKey))!;
      await ours.raw.set(ourKey, entry);
      await expectRejectedThenRecomputed(ours, alice);
    });

    it('key names are keyed: not the unsealed cachedResultPath, and different per secret', async () => {
      const first = await setup();
      const second = await setup();
      const a = await first.keyOf(alice);
      const b = await second.keyOf(alice);
      expect(a).not.toBe(cachedResultPath(job(alice)));
      expect(a).not.toBe(b);
      expect(a.startsWith('ws/cache/')).toBe(true);
    });

    it('the rows are not in the stored bytes in clear', async () => {
      const s = await setup();
      const key = await s.keyOf(alice);
      const entry = (await s.raw.get(key))!;
      expect(entry.includes(Buffer.from(`record of ${alice}`))).toBe(false);
      expect((await s.cache.run(job(alice))).fromCache).toBe(true);
    });
  });
}
