/**
 * One measurement of `memory_per_entry`, in a process of its own (run by `memory_per_entry.ts`
 * with `--expose-gc`): `node --expose-gc --import tsx bench/memory_entry_process.ts <subject>
 * <entries>` fills one cache with `entries` results of 1 KiB JSON and prints, as one JSON line,
 * what the process holds per entry after full collections (heap + external, and RSS) and what
 * the store counts against `maxBytes` per entry.
 *
 * Subjects:
 * - `ours`: `createViewerCache(...).run` over a `MemoryCacheStore`, one viewer per entry;
 * - `lru`: a bare `lru-cache` (bounded by count) holding the same JSON bytes as a `Buffer`
 *   under a key of the same shape (`<workspace>/cache/<64 hex>`), as a user of it would.
 */
import { createHash } from 'node:crypto';
import { LRUCache } from 'lru-cache';
import { createViewerCache, MemoryCacheStore } from '../src/index.js';
import { payloadJson } from './fixtures.js';

const [subject = 'ours', entriesArg = '100000'] = process.argv.slice(2);
const entries = Number(entriesArg);
const gc = (globalThis as { gc?: () => void }).gc;
if (gc === undefined) throw new Error('run with --expose-gc');

const json = payloadJson(1024);
const value: unknown = JSON.parse(json.toString('utf8'));
const text = json.toString('utf8');

/** Heap + external and RSS after full collections. */
function sample(): { heapExternal: number; rss: number } {
  for (let i = 0; i < 4; i++) gc!();
  const { heapUsed, external, rss } = process.memoryUsage();
  return { heapExternal: heapUsed + external, rss };
}

let counted = Number.NaN;
let held: { size: number } | null = null;
let before: { heapExternal: number; rss: number };
if (subject === 'ours') {
  const store = new MemoryCacheStore({ maxBytes: '4gb', maxEntryBytes: '1mb' });
  const cache = createViewerCache({ functions: { 'f/orders': () => value }, store, ttl: '1h' });
  // One warm-up run outside the measurement: the code paths, the executor, the first key.
  await cache.run({
    path: 'f/orders',
    origin: { kind: 'app', session: { email: 'warm@example.com' } },
  });
  before = sample();
  for (let i = 0; i < entries; i++) {
    await cache.run({
      path: 'f/orders',
      args: { page: 1 },
      origin: { kind: 'app', session: { email: `viewer${i}@example.com` } },
    });
  }
  if (store.size !== entries + 1) throw new Error(`holds ${store.size} of ${entries + 1}`);
  counted = store.bytes;
  held = store;
} else if (subject === 'lru') {
  const lru = new LRUCache<string, Buffer>({ max: entries * 2 });
  before = sample();
  for (let i = 0; i < entries; i++) {
    const digest = createHash('sha256').update(`viewer${i}@example.com`).digest('hex');
    lru.set(`default/cache/${digest}`, Buffer.from(text));
  }
  held = lru;
} else {
  throw new Error(`unknown subject ${subject}`);
}
const after = sample();
console.log(
  JSON.stringify({
    subject,
    entries,
    heapExternalPerEntry: (after.heapExternal - before.heapExternal) / entries,
    rssPerEntry: (after.rss - before.rss) / entries,
    countedPerEntry: counted / (entries + 1),
    size: held.size,
  }),
);
