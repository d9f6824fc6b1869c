/**
 * `memory_per_entry`: what an entry of the in-process store really costs, against a bare
 * `lru-cache` holding the same JSON, and against what the store counts toward `maxBytes`.
 * Each measurement is a process of its own (`memory_entry_process.ts`, `--expose-gc`, full
 * collections before and after filling 100 k entries of 1 KiB JSON), subjects interleaved in
 * rounds; medians with their ranges. No timing: the figures are bytes.
 *
 * `npx tsx bench/memory_per_entry.ts [--quick]` runs it alone (no Redis, no Postgres).
 */
import { execFile } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { fmt, markdownTable } from './helpers.js';

const PROCESS = join(dirname(fileURLToPath(import.meta.url)), 'memory_entry_process.ts');
/** Goals: ≤ 1.3 × lru-cache per entry; what the store counts within 10 % of what it holds. */
export const MAX_VS_LRU = 1.3;
export const COUNTED_TOLERANCE = 0.1;

interface Sample {
  heapExternalPerEntry: number;
  rssPerEntry: number;
  countedPerEntry: number;
}

export interface MemoryPerEntry {
  entries: number;
  rounds: number;
  ours: { heapExternal: number[]; rss: number[]; counted: number[] };
  lru: { heapExternal: number[]; rss: number[] };
}

async function measureOnce(subject: 'ours' | 'lru', entries: number): Promise<Sample> {
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['--expose-gc', '--import', 'tsx', PROCESS, subject, String(entries)],
    { maxBuffer: 1 << 20 },
  );
  return JSON.parse(stdout.trim().split('\n').pop()!) as Sample;
}

/** `rounds` rounds of both subjects, alternating which goes first. */
export async function memoryPerEntry(quick: boolean): Promise<MemoryPerEntry> {
  const entries = 100_000;
  const rounds = quick ? 2 : 5;
  const out: MemoryPerEntry = {
    entries,
    rounds,
    ours: { heapExternal: [], rss: [], counted: [] },
    lru: { heapExternal: [], rss: [] },
  };
  for (let r = 0; r < rounds; r++) {
    const order = r % 2 === 0 ? (['ours', 'lru'] as const) : (['lru', 'ours'] as const);
    for (const subject of order) {
      const s = await measureOnce(subject, entries);
      if (subject === 'ours') {
        out.ours.heapExternal.push(s.heapExternalPerEntry);
        out.ours.rss.push(s.rssPerEntry);
        out.ours.counted.push(s.countedPerEntry);
      } else {
        out.lru.heapExternal.push(s.heapExternalPerEntry);
        out.lru.rss.push(s.rssPerEntry);
      }
    }
  }
  return out;
}

const median = (xs: readonly number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 === 1
    ? s[(s.length - 1) / 2]!
    : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const range = (xs: readonly number[], digits = 0) =>
  `${fmt(Math.min(...xs), digits)}–${fmt(Math.max(...xs), digits)}`;

/** The table: bytes per entry, and the two ratios judged against their goals. */
/** The two goals' figures: heap+external per entry ÷ lru-cache's, and real ÷ counted. */
export function memoryPerEntryVerdict(m: MemoryPerEntry): {
  vsLru: number[];
  realVsCounted: number[];
  ratio: number;
  real: number;
  ratioMet: boolean;
  realMet: boolean;
} {
  const vsLru = m.ours.heapExternal.map((o, i) => o / m.lru.heapExternal[i]!);
  const realVsCounted = m.ours.heapExternal.map((o, i) => o / m.ours.counted[i]!);
  const ratio = median(vsLru);
  const real = median(realVsCounted);
  return {
    vsLru,
    realVsCounted,
    ratio,
    real,
    ratioMet: ratio <= MAX_VS_LRU,
    realMet: Math.abs(real - 1) <= COUNTED_TOLERANCE,
  };
}

export function memoryPerEntryTable(m: MemoryPerEntry): string {
  const ours = median(m.ours.heapExternal);
  const lru = median(m.lru.heapExternal);
  const { vsLru, realVsCounted, ratio, real } = memoryPerEntryVerdict(m);
  const mark = (met: boolean) => (met ? '✅' : '❌');
  return [
    `Memory per entry: ${m.entries / 1000} k entries of 1 KiB JSON, each measurement a process of its own (\`--expose-gc\`, full GCs before and after), ${m.rounds} interleaved rounds; medians (ranges).`,
    '',
    markdownTable(
      ['subject', 'heap + external B/entry', 'RSS B/entry', 'counted B/entry', 'ratio', 'goal'],
      [
        [
          '`createViewerCache(...).run`, `MemoryCacheStore`',
          `${fmt(ours, 0)} (${range(m.ours.heapExternal)})`,
          `${fmt(median(m.ours.rss), 0)} (${range(m.ours.rss)})`,
          fmt(median(m.ours.counted), 0),
          `${fmt(ratio, 2)}× lru-cache (${range(vsLru, 2)})`,
          `${mark(ratio <= MAX_VS_LRU)} ≤ ${MAX_VS_LRU}× lru-cache`,
        ],
        [
          'the same: real ÷ counted toward `maxBytes`',
          '',
          '',
          '',
          `${fmt(real, 2)}× (${range(realVsCounted, 2)})`,
          `${mark(Math.abs(real - 1) <= COUNTED_TOLERANCE)} 1.0 ± ${COUNTED_TOLERANCE * 100} %`,
        ],
        [
          'bare `lru-cache`, the same JSON as a `Buffer` (baseline)',
          `${fmt(lru, 0)} (${range(m.lru.heapExternal)})`,
          `${fmt(median(m.lru.rss), 0)} (${range(m.lru.rss)})`,
          '—',
          '1.00×',
          '',
        ],
      ],
    ),
  ].join('\n');
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const m = await memoryPerEntry(process.argv.includes('--quick'));
  console.log(memoryPerEntryTable(m));
}
