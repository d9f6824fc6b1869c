/**
 * `key_derivation`: `cachedResultPath` alone for a ten-field args object (SPEC: ≤ 3 µs p50),
 * beside the naive recipe it replaces — fast-json-stable-stringify + SHA-256, with none of the
 * validation that refuses args JSON cannot carry. `key_hit_lookup`: what a hit pays for the
 * same key, a run seen before found by its parts (`CacheRuns.of`, `KeyPartsMemo`).
 */
import { hash } from 'node:crypto';
import stableStringify from 'fast-json-stable-stringify';
import { plainEntries } from '../src/cache/cache_entry.js';
import { CacheRuns } from '../src/cache/cache_run.js';
import { cachedResultPath, recordViewerIdentity } from '../src/index.js';
import type { ScenarioSet, SizeFixture } from './fixtures.js';

export async function keyDerivation(fx: SizeFixture): Promise<ScenarioSet> {
  const { jobs } = fx;
  const n = jobs.length;
  // The same jobs made with a scoped API key: the scope is an eighth key element.
  const scoped = jobs.map((job) => ({
    ...job,
    perms: { ...job.perms, roleScope: [16384, 16390] },
  }));
  let sink = 0;
  // A result cache's run names, every job seen once (as its first run, a miss, leaves them).
  const runs = new CacheRuns(plainEntries, false);
  for (const job of jobs) runs.of(job, null, 60_000, {});
  // The same jobs for embed viewers (one frozen viewer per job, as recordViewerIdentity leaves
  // it), so the row shows the cost of the object viewer element.
  const embedJobs = jobs.map((job, i) => ({
    ...job,
    perms: {
      ...job.perms,
      ...recordViewerIdentity({
        kind: 'embed',
        viewer: {
          app: 'orders',
          attributes: { customer_id: `c-${i % 97}`, region: 'eu', tier: 'gold' },
          email: null,
        },
      }),
    },
  }));
  return {
    scenarios: [
      {
        id: 'key_naive',
        label: 'stable-stringify + SHA-256, no validation (baseline)',
        async: false,
        op: (i: number) => {
          const { workspace, runnable, perms, args } = jobs[i % n]!;
          const input = [workspace, runnable.path, runnable.hash, perms.endUserEmail, null, args];
          sink ^= hash('sha256', stableStringify(input), 'hex').length;
        },
      },
      {
        id: 'key_derivation',
        label: '`cachedResultPath`, ten-field args',
        async: false,
        op: (i: number) => {
          sink ^= cachedResultPath(jobs[i % n]!).length;
        },
      },
      {
        id: 'key_hit_lookup',
        label:
          "a hit's key: the same jobs, each seen before, found by their parts (`CacheRuns.of`)",
        async: false,
        op: (i: number) => {
          sink ^= runs.of(jobs[i % n]!, null, 60_000, {}).key.length;
        },
      },
      {
        id: 'key_derivation_scoped',
        label: '`cachedResultPath`, ten-field args, a two-role scope',
        async: false,
        op: (i: number) => {
          sink ^= cachedResultPath(scoped[i % n]!).length;
        },
      },
      {
        id: 'key_derivation_embed',
        label: '`cachedResultPath`, ten-field args, an embed viewer with three attributes',
        async: false,
        op: (i: number) => {
          sink ^= cachedResultPath(embedJobs[i % n]!).length;
        },
      },
    ],
    close: async () => {
      // Keeps `sink` observable so the work above cannot be optimised away.
      if (sink === -1) console.log(sink);
    },
  };
}
