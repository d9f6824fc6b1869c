/**
 * The README's benchmark table: one line per SPEC (and issue) target, every figure from the same
 * `npm run bench` run, written between the summary markers of README.md with the run's date and
 * load. The full tables, with every row and baseline, are in docs/benchmarks.md.
 */
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { ChurnRow } from './churn_bench.js';
import type { DatatableRow } from './datatable_bench.js';
import { type ExecutionRow, ratioText } from './execution_report.js';
import { fmt, markdownTable } from './helpers.js';
import {
  COUNTED_TOLERANCE,
  MAX_VS_LRU,
  type MemoryPerEntry,
  memoryPerEntryVerdict,
} from './memory_per_entry.js';
import type { OutsiderHttp, QueueWork } from './outsider_report.js';
import { ROOT } from './readme.js';
import {
  type Environment,
  envLine,
  HTTP_MAX_FLOOR_RATIO,
  HTTP_MIN_FLOOR_THROUGHPUT,
  KEY_P50_MAX_US,
  MEMORY_SCALING_MAX,
  pairedRatio,
  REDIS_HIT_MAX_RATIO,
  REDIS_HIT_MIN_THROUGHPUT,
  type Row,
  SEALED_MAX_RATIO,
  SEALED_MIN_THROUGHPUT,
} from './report.js';

/** SPEC's queue targets: added p50 over in process, and that ÷ a bare BullMQ round trip; rate. */
const QUEUE_ADDED_MAX_MS = 2;
const QUEUE_ADDED_MAX_VS_BARE = 1.5;
const QUEUE_MIN_THROUGHPUT = 0.8;
/** The Redis-only server's p50 is judged against the sealed floor route (README, "Two floors"). */
const HTTP_CACHED = HTTP_MAX_FLOOR_RATIO['http_cached']!;
const HTTP_REDIS_ONLY = HTTP_MAX_FLOOR_RATIO['http_cached_redis_only']!;

export interface SummaryInput {
  readonly env: Environment;
  readonly rows: readonly Row[];
  readonly valueRows: readonly Row[];
  readonly memory: MemoryPerEntry | undefined;
  readonly datatable: readonly DatatableRow[];
  readonly outsider: OutsiderHttp | undefined;
  readonly execution: readonly ExecutionRow[];
  readonly queueWork: QueueWork | undefined;
  readonly churn: readonly ChurnRow[];
}

/** One line: what, the latest figure, the target, and whether it is met (`undefined`: a figure). */
type Line = readonly [figure: string, latest: string, target: string, met: boolean | undefined];

const mark = (met: boolean | undefined) => (met === undefined ? '' : met ? '✅' : '❌');

/** `1.08× (1.02–1.15)`: a ratio with the lowest and highest of its blocks. */
function times(ratio: number, range?: readonly [number, number]): string {
  if (range === undefined || range[0] === range[1]) return `${fmt(ratio, 2)}×`;
  return `${fmt(ratio, 2)}× (${fmt(range[0], 2)}–${fmt(range[1], 2)})`;
}

function hitLines(rows: readonly Row[]): Line[] {
  const lines: Line[] = [];
  const find = (payload: string, mode: string, id: string) =>
    rows.find((r) => r.payload === payload && r.mode === mode && r.id === id);
  for (const payload of ['1 KiB', '64 KiB']) {
    const hit = find(payload, 'single', 'redis_hit');
    const keyed = find(payload, 'single', 'redis_keyed_get');
    if (hit?.target !== undefined) {
      const vsKeyed =
        keyed === undefined
          ? ''
          : `; ÷ the keyed floor ${fmt(pairedRatio(hit, keyed, true).median, 2)}×`;
      lines.push([
        `Redis-tier hit p50 ÷ raw \`GET\`, ${payload}`,
        `${times(hit.ratio, hit.range)}${vsKeyed}`,
        `≤ ${REDIS_HIT_MAX_RATIO}×`,
        hit.target.met,
      ]);
    }
  }
  for (const payload of ['1 KiB', '64 KiB']) {
    const hit = rows.find(
      (r) => r.payload === payload && r.mode !== 'single' && r.id === 'redis_hit',
    );
    if (hit?.target !== undefined) {
      lines.push([
        `the same, ${hit.mode.slice(1)} callers, ops/s ÷ raw \`GET\`, ${payload}`,
        times(hit.ratio, hit.range),
        `≥ ${REDIS_HIT_MIN_THROUGHPUT[payload]}×`,
        hit.target.met,
      ]);
    }
  }
  for (const single of [true, false]) {
    for (const payload of ['1 KiB', '64 KiB']) {
      const sealed = rows.find(
        (r) =>
          r.payload === payload && (r.mode === 'single') === single && r.id === 'redis_hit_sealed',
      );
      const floor = rows.find(
        (r) => r.payload === payload && r.mode === sealed?.mode && r.id === 'sealed_floor',
      );
      if (sealed?.target === undefined || floor === undefined) continue;
      const { median, min, max } = pairedRatio(sealed, floor, single);
      lines.push([
        single
          ? `sealed hit p50 ÷ sealed floor, ${payload}`
          : `the same, ${sealed.mode.slice(1)} callers, ops/s ÷ sealed floor, ${payload}`,
        times(median, [min, max]),
        single ? `≤ ${SEALED_MAX_RATIO}×` : `≥ ${SEALED_MIN_THROUGHPUT}×`,
        sealed.target.met,
      ]);
    }
  }
  const key = rows.find((r) => r.id === 'key_derivation');
  const lookup = rows.find((r) => r.id === 'key_hit_lookup');
  if (key?.target !== undefined) {
    lines.push([
      'key derivation, ten-field args, p50; a hit\u2019s key found from the run\u2019s parts',
      `${fmt(key.p50Us, 2)} µs${lookup === undefined ? '' : `; ${fmt(lookup.p50Us, 2)} µs`}`,
      `≤ ${KEY_P50_MAX_US} µs`,
      key.target.met,
    ]);
  }
  const scale = rows.find((r) => r.id === 'scale_memory_hit_1m');
  const lru = rows.find((r) => r.id === 'scale_lru_get_1m');
  if (scale?.target !== undefined && lru !== undefined) {
    lines.push([
      'in-process hit, 1 M entries ÷ 1 k entries, p50',
      `${times(scale.ratio, scale.range)}; bare lru-cache: ${times(lru.ratio, lru.range)}`,
      `≤ ${MEMORY_SCALING_MAX} × bare lru-cache\u2019s growth`,
      scale.target.met,
    ]);
  }
  return lines;
}

function valueLines(rows: readonly Row[]): Line[] {
  return rows
    .filter((r) => r.id === 'value_hit' && r.target !== undefined)
    .map((r) => [
      r.mode === 'single'
        ? 'hit returning the value (`createViewerCache`, 1 KiB), p50'
        : `the same, ${r.mode.slice(1)} callers, hits/s`,
      r.target!.text.replace(/ \([^)]*\)/g, ''),
      r.mode === 'single'
        ? '≤ 1.3× keyed floor; ≤ 1× BentoCache `serialize: false`'
        : '≥ 1× BentoCache',
      r.target!.met,
    ]);
}

function memoryLines(m: MemoryPerEntry | undefined): Line[] {
  if (m === undefined) return [];
  const v = memoryPerEntryVerdict(m);
  return [
    [
      'memory store, heap+external per 1 KiB entry ÷ lru-cache',
      `${fmt(v.ratio, 2)}×`,
      `≤ ${MAX_VS_LRU}×`,
      v.ratioMet,
    ],
    [
      'the same, real ÷ counted toward `maxBytes`',
      `${fmt(v.real, 2)}×`,
      `1.0 ± ${COUNTED_TOLERANCE * 100} %`,
      v.realMet,
    ],
  ];
}

function httpLines(o: OutsiderHttp | undefined): Line[] {
  if (o === undefined) return [];
  const lines: Line[] = [];
  for (const row of o.rows) {
    if (row.id === 'cached') {
      const met = row.p50VsFloor <= HTTP_CACHED && row.reqPerSVsFloor >= HTTP_MIN_FLOOR_THROUGHPUT;
      lines.push([
        `HTTP cached request, default tiers, p50 / req/s ÷ the floor route, ${row.conns} conns (autocannon)`,
        `${fmt(row.p50VsFloor, 2)}× / ${fmt(row.reqPerSVsFloor, 2)}×`,
        `≤ ${HTTP_CACHED}× / ≥ ${HTTP_MIN_FLOOR_THROUGHPUT}×`,
        met,
      ]);
    } else if (row.id === 'redisOnly' && row.p50VsSealedFloor !== undefined) {
      const rps = row.reqPerSVsSealedFloor ?? Number.NaN;
      const met = row.p50VsSealedFloor <= HTTP_REDIS_ONLY && rps >= HTTP_MIN_FLOOR_THROUGHPUT;
      lines.push([
        `the same, Redis only (sealed), ÷ the sealed floor route, ${row.conns} conns`,
        `${fmt(row.p50VsSealedFloor, 2)}× / ${fmt(rps, 2)}× (÷ the plain floor: ${fmt(row.p50VsFloor, 2)}× / ${fmt(row.reqPerSVsFloor, 2)}×)`,
        `≤ ${HTTP_REDIS_ONLY}× / ≥ ${HTTP_MIN_FLOOR_THROUGHPUT}×`,
        met,
      ]);
    }
  }
  return lines;
}

function churnLines(rows: readonly ChurnRow[]): Line[] {
  const [steady, churn] = rows;
  if (steady === undefined || churn === undefined) return [];
  const ratio = churn.hitRatio / steady.hitRatio;
  return [
    [
      'hit ratio with one membership change per second ÷ without',
      `${fmt(ratio, 3)}×`,
      '≥ 0.95×',
      ratio >= 0.95,
    ],
  ];
}

function datatableLines(rows: readonly DatatableRow[]): Line[] {
  const ids = ['datatable_warm_miss_role', 'datatable_warm_miss_set', 'set_login_first_use'];
  return rows
    .filter((r) => ids.includes(r.id) && r.target !== undefined)
    .map((r) => [
      r.id === 'set_login_first_use'
        ? 'first use of a new set login ÷ a bare scram connection'
        : `warm miss as the viewer (${r.id.endsWith('_set') ? 'two roles' : 'one role'}), over the runnable\u2019s query`,
      r.vsBaseline.kind === 'added'
        ? `+${fmt(r.vsBaseline.value, 0)} µs`
        : `${fmt(r.vsBaseline.value, 2)}×`,
      r.target!.text.replace(/:.*$/, ''),
      r.target!.met,
    ]);
}

function executionLines(rows: readonly ExecutionRow[], work: QueueWork | undefined): Line[] {
  const lines: Line[] = [];
  const added = rows.find((r) => r.id === 'queue_added_vs_bare_p50');
  if (added !== undefined) {
    lines.push([
      'queued miss, added p50 over in process; ÷ a bare BullMQ round trip',
      `+${fmt(added.value, 2)} ms; ${fmt(added.ratio, 2)}×`,
      `≤ ${QUEUE_ADDED_MAX_MS} ms; ≤ ${QUEUE_ADDED_MAX_VS_BARE}×`,
      added.value <= QUEUE_ADDED_MAX_MS && added.ratio <= QUEUE_ADDED_MAX_VS_BARE,
    ]);
  }
  const rate = rows.find((r) => r.id === 'queue_misses_1w');
  if (rate !== undefined) {
    lines.push([
      'queued misses/s, one worker, ÷ in process',
      ratioText(rate, '×'),
      `≥ ${QUEUE_MIN_THROUGHPUT}×`,
      rate.ratio >= QUEUE_MIN_THROUGHPUT,
    ]);
  }
  const queued = work?.rows.find((r) => r.label === 'queued miss');
  if (queued !== undefined) {
    lines.push([
      'queued miss: PostgreSQL transactions / Redis commands per miss',
      `${fmt(queued.pg, 1)} / ${fmt(queued.redis, 0)}`,
      '—',
      undefined,
    ]);
  }
  return lines;
}

/** The README's table, with the run it comes from. */
export function readmeSummary(input: SummaryInput): string {
  const lines = [
    ...hitLines(input.rows),
    ...valueLines(input.valueRows),
    ...memoryLines(input.memory),
    ...httpLines(input.outsider),
    ...datatableLines(input.datatable),
    ...churnLines(input.churn),
    ...executionLines(input.execution, input.queueWork),
  ];
  const missed = lines.filter((l) => l[3] === false).length;
  const judged = lines.filter((l) => l[3] !== undefined).length;
  return [
    `From the full \`npm run bench\` on ${envLine(input.env)}: ` +
      `${judged - missed} of ${judged} targets met in this run. A ratio in brackets is the ` +
      'lowest–highest over the blocks of rounds the run kept.',
    '',
    markdownTable(
      ['figure (each against a baseline of the same run)', 'latest', 'target', 'met'],
      lines.map(([figure, latest, target, met]) => [figure, latest, target, mark(met)]),
    ),
  ].join('\n');
}

const START = '<!-- bench-summary:start (written by `npm run bench`) -->';
const END = '<!-- bench-summary:end -->';

/** Replaces README.md's summary between its markers; a README without them is left alone. */
export async function writeReadmeSummary(summary: string): Promise<boolean> {
  const path = join(ROOT, 'README.md');
  const readme = await readFile(path, 'utf8');
  const from = readme.indexOf(START);
  const to = readme.indexOf(END);
  if (from === -1 || to < from) return false;
  await writeFile(path, `${readme.slice(0, from)}${START}\n${summary}\n${readme.slice(to)}`);
  return true;
}
