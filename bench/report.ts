/**
 * What a bench run reports: rows with their ratio to the baseline of the same run, the SPEC
 * targets they are judged against, and the Markdown tables drawn from them.
 */
import { availableParallelism, cpus, loadavg } from 'node:os';
import type { DatatableRow } from './datatable_bench.js';
import { rawRedis, VIEWERS } from './fixtures.js';
import {
  fmt,
  type LatencyStats,
  markdownTable,
  type QuietReport,
  type Scenario,
  type ThroughputStats,
} from './helpers.js';

/** Concurrent callers in the throughput tables. */
export const CONCURRENCY = 64;
/** Ratio targets from SPEC "Performance". */
export const REDIS_HIT_MAX_RATIO = 1.1;
export const REDIS_HIT_MIN_THROUGHPUT: Record<string, number> = { '1 KiB': 1.0, '64 KiB': 0.95 };
/** Sealed: against the sealed floor (`sealed_floor.ts`), p50 and ops/s at 64 callers. */
export const SEALED_MAX_RATIO = 1.1;
export const SEALED_MIN_THROUGHPUT = 0.95;
export const KEY_P50_MAX_US = 3;
export const MEMORY_SCALING_MAX = 1.2;
const SCALE_CYCLE_NOTE = 'all 1 k entries, or 100 k of the 1 M';

export interface Row {
  payload: string;
  id: string;
  label: string;
  mode: 'single' | `c${number}`;
  ops: number;
  opsPerSec: number;
  p50Us: number;
  p99Us: number;
  /**
   * Single caller: p50 ÷ baseline p50. Concurrent: ops/s ÷ baseline ops/s. The median of the
   * ratios of the blocks the two ran side by side (see {@link pairedRatio}); `range` their span.
   */
  ratio: number;
  range?: readonly [number, number];
  baseline: string;
  /** Per kept block, the figure ratios are taken of (p50 µs, or ops/s): see `LatencyStats`. */
  perBlock?: readonly number[];
  /** How the measurement's blocks fared against other processes' load. */
  quiet?: QuietReport;
  /** `met` undefined: a figure to read, not a target. */
  target?: { text: string; met?: boolean };
}

export interface Environment {
  date: string;
  node: string;
  redis: string;
  postgres: string;
  cpu: string;
  cores: number;
  /** 1-minute load average when the run started and ended: the machine is shared. */
  load: string;
  viewers: number;
  concurrency: number;
}

export async function environment(): Promise<Environment> {
  const client = rawRedis();
  const info = await client.info('server');
  client.disconnect();
  const redis = /redis_version:(\S+)/.exec(info)?.[1] ?? 'unknown';
  return {
    date: new Date().toISOString().slice(0, 10),
    node: process.version,
    redis,
    postgres: 'measured below',
    cpu: cpus()[0]?.model.trim() ?? 'unknown',
    cores: availableParallelism(),
    load: loadavg()[0]!.toFixed(2),
    viewers: VIEWERS,
    concurrency: CONCURRENCY,
  };
}

/** The part of a row a paired ratio reads. */
type Measured = Pick<Row, 'p50Us' | 'opsPerSec' | 'perBlock'>;

/**
 * `a` against `b` (p50 ÷ p50 one caller, ops/s ÷ ops/s concurrent): the median of their
 * per-block ratios, with the lowest and highest, when both were measured in the same blocks;
 * else the ratio of their pooled figures (range equal to it).
 */
export function pairedRatio(
  a: Measured,
  b: Measured,
  single: boolean,
): { median: number; min: number; max: number } {
  const pa = a.perBlock;
  const pb = b.perBlock;
  if (pa === undefined || pb === undefined || pa.length === 0 || pa.length !== pb.length) {
    const pooled = single ? a.p50Us / b.p50Us : a.opsPerSec / b.opsPerSec;
    return { median: pooled, min: pooled, max: pooled };
  }
  const ratios = pa.map((x, i) => x / pb[i]!).sort((x, y) => x - y);
  const mid = ratios.length >> 1;
  const median = ratios.length % 2 === 1 ? ratios[mid]! : (ratios[mid - 1]! + ratios[mid]!) / 2;
  return { median, min: ratios[0]!, max: ratios[ratios.length - 1]! };
}

/** Rows of one measurement, each with its paired ratio to `baseline`'s. */
function rowsOf(
  payload: string,
  scenarios: readonly Scenario[],
  stats: Map<string, LatencyStats | ThroughputStats>,
  baseline: string,
): Row[] {
  const base = stats.get(baseline)!;
  return scenarios.map((s) => {
    const st = stats.get(s.id)!;
    const single = !('concurrency' in st);
    const { median, min, max } = pairedRatio(st, base, single);
    return {
      payload,
      id: s.id,
      label: s.label,
      mode: 'concurrency' in st ? `c${st.concurrency}` : 'single',
      ops: st.ops,
      opsPerSec: st.opsPerSec,
      p50Us: st.p50Us,
      p99Us: st.p99Us,
      ratio: median,
      range: [min, max],
      baseline,
      perBlock: st.perBlock,
      quiet: st.quiet,
    };
  });
}

/** One caller's rows (ratio of p50s) and concurrent callers' (ratio of ops/s): one shape. */
export const latencyRows = rowsOf;
export const throughputRows = rowsOf;

/** A ratio with its range over the blocks, as a table cell: `1.08 (1.02–1.15)`. */
export function ratioCell(ratio: number, range: readonly [number, number] | undefined): string {
  if (range === undefined || range[0] === range[1]) return fmt(ratio, 2);
  return `${fmt(ratio, 2)} (${fmt(range[0], 2)}–${fmt(range[1], 2)})`;
}

/**
 * What a table's blocks were, per measurement (a payload's rows share one):
 * `; blocks of rounds kept (others ≤ 15 % of the machine): 1 KiB 10 of 10, 64 KiB 9 of 10; …`.
 */
export function quietNote(rows: readonly Row[]): string {
  const mixed = new Set(rows.map((r) => r.mode)).size > 1;
  // One measurement's rows share a report (by value: rows may come through JSON from a child).
  const seen = new Map<string, [QuietReport, string]>();
  for (const r of rows) {
    if (r.quiet === undefined) continue;
    const callers = r.mode === 'single' ? 'one caller' : `${r.mode.slice(1)} callers`;
    const label = mixed ? `${r.payload} ${callers}:` : r.payload;
    const key = `${label} ${JSON.stringify(r.quiet)}`;
    if (!seen.has(key)) seen.set(key, [r.quiet, label]);
  }
  const reports = [...seen.values()];
  if (reports.length === 0) return '';
  const maxOther = reports[0]![0].maxOther;
  if (maxOther >= 1) return `; ${reports[0]![0].blocks} blocks of rounds, all kept`;
  const named = reports.length > 1 || reports[0]![1] !== '—';
  const parts = reports.map(
    ([q, label]) =>
      `${named ? `${label} ` : ''}${q.kept} of ${q.blocks}` +
      (q.allDropped ? ' (**none quiet: figures from all blocks**)' : ''),
  );
  return (
    `; blocks of rounds kept (others ≤ ${Math.round(maxOther * 100)} % of the machine): ` +
    `${parts.join(', ')}; a ratio is the median over the kept blocks (lowest–highest)`
  );
}

/** Attaches the SPEC targets to the rows they concern. */
export function judge(rows: Row[]): void {
  const find = (payload: string, mode: string, id: string) =>
    rows.find((r) => r.payload === payload && r.mode === mode && r.id === id);
  for (const row of rows) {
    if (row.id === 'redis_hit' && row.mode === 'single') {
      // Beside the verdict: the part of the distance that is the viewer's key alone.
      const keyed = find(row.payload, row.mode, 'redis_keyed_get');
      row.target = {
        text:
          `≤ ${REDIS_HIT_MAX_RATIO}× raw GET` +
          (keyed === undefined
            ? ''
            : ` (${fmt(pairedRatio(row, keyed, true).median, 2)}× the keyed floor)`),
        met: row.ratio <= REDIS_HIT_MAX_RATIO,
      };
    } else if (row.id === 'redis_hit' && REDIS_HIT_MIN_THROUGHPUT[row.payload] !== undefined) {
      const min = REDIS_HIT_MIN_THROUGHPUT[row.payload]!;
      row.target = { text: `ops/s ≥ ${min}× raw GET`, met: row.ratio >= min };
    } else if (row.id === 'redis_hit_sealed') {
      const floor = find(row.payload, row.mode, 'sealed_floor');
      if (floor === undefined) continue;
      const single = row.mode === 'single';
      const vs = pairedRatio(row, floor, single).median;
      row.target = single
        ? {
            text: `p50 ${fmt(vs, 2)}× sealed floor (≤ ${SEALED_MAX_RATIO}×)`,
            met: vs <= SEALED_MAX_RATIO,
          }
        : {
            text: `ops/s ${fmt(vs, 2)}× sealed floor (≥ ${SEALED_MIN_THROUGHPUT}×)`,
            met: vs >= SEALED_MIN_THROUGHPUT,
          };
    } else if (row.id === 'scale_memory_hit_1m') {
      const lru = find(row.payload, row.mode, 'scale_lru_get_1m');
      if (lru === undefined) continue;
      row.target = {
        text: `growth ≤ ${MEMORY_SCALING_MAX} × bare lru-cache's (${fmt(lru.ratio, 2)}×)`,
        met: row.ratio <= MEMORY_SCALING_MAX * lru.ratio,
      };
    } else if (row.id === 'key_derivation') {
      row.target = { text: `p50 ≤ ${KEY_P50_MAX_US} µs`, met: row.p50Us <= KEY_P50_MAX_US };
    } else if (row.id === 'two_tier_memory_hit' || row.id === 'two_tier_redis_hit') {
      // Against the peer: our memory tier against BentoCache's L1; our Redis path against its L2.
      const peerId =
        row.id === 'two_tier_memory_hit' ? 'bento_tiered_l1_hit' : 'bento_tiered_l2_hit';
      const peer = find(row.payload, row.mode, peerId);
      if (peer === undefined) continue;
      const single = row.mode === 'single';
      const vs = pairedRatio(row, peer, single).median;
      row.target = {
        text: `${single ? 'p50' : 'ops/s'} ${fmt(vs, 2)}× \`${peerId}\``,
        met: single ? vs < 1 : vs > 1,
      };
    } else if (row.id === 'memory_hit') {
      const peers = ['bento_memory_hit', 'bento_memory_ref_hit']
        .map((id) => find(row.payload, row.mode, id))
        .filter((r): r is Row => r !== undefined);
      if (peers.length === 0) continue;
      const single = row.mode === 'single';
      const ratios = peers.map((p) => pairedRatio(row, p, single).median);
      const met = ratios.every((r) => (single ? r < 1 : r > 1));
      const vs = ratios.map((r) => `${fmt(r, 2)}×`).join(' / ');
      row.target = {
        text: single ? `p50 < BentoCache memory (${vs})` : `ops/s > BentoCache memory (${vs})`,
        met,
      };
    }
  }
}

const verdict = (row: Row) => {
  if (!row.target) return '';
  const { met, text } = row.target;
  return met === undefined ? text : `${met ? '✅' : '❌'} ${text}`;
};

export function tables(rows: readonly Row[]): string {
  const single = rows.filter(
    (r) => r.mode === 'single' && !r.id.startsWith('key_') && !r.id.startsWith('scale_'),
  );
  const concurrent = rows.filter((r) => r.mode !== 'single');
  const keys = rows.filter((r) => r.id.startsWith('key_'));
  const scaling = rows.filter((r) => r.id.startsWith('scale_'));
  const scenarioCell = (r: Row) => `\`${r.id}\` — ${r.label}`;
  return [
    `**Hits, one caller at a time** (${VIEWERS} viewers cycling; ratio = p50 ÷ \`redis_raw_get\` p50 of the same payload, same run${quietNote(single)}):`,
    '',
    markdownTable(
      ['payload', 'scenario', 'ops/s', 'p50 µs', 'p99 µs', 'p50 × raw GET', 'target'],
      single.map((r) => [
        r.payload,
        scenarioCell(r),
        fmt(r.opsPerSec, 0),
        fmt(r.p50Us),
        fmt(r.p99Us),
        ratioCell(r.ratio, r.range),
        verdict(r),
      ]),
    ),
    '',
    `**Hits, ${CONCURRENCY} concurrent callers** (throughput; ratio = ops/s ÷ \`redis_raw_get\` ops/s; p50/p99 are the latencies callers saw under that load${quietNote(concurrent)}):`,
    '',
    markdownTable(
      ['payload', 'scenario', 'ops/s', 'ops/s × raw GET', 'p50 µs', 'p99 µs', 'target'],
      concurrent.map((r) => [
        r.payload,
        scenarioCell(r),
        fmt(r.opsPerSec, 0),
        ratioCell(r.ratio, r.range),
        fmt(r.p50Us),
        fmt(r.p99Us),
        verdict(r),
      ]),
    ),
    '',
    `**Key derivation** (ratio = p50 ÷ \`key_naive\` p50${quietNote(keys)}):`,
    '',
    markdownTable(
      ['scenario', 'ops/s', 'p50 µs', 'p99 µs', 'p50 × naive', 'target'],
      keys.map((r) => [
        scenarioCell(r),
        fmt(r.opsPerSec, 0),
        fmt(r.p50Us, 2),
        fmt(r.p99Us, 2),
        ratioCell(r.ratio, r.range),
        verdict(r),
      ]),
    ),
    '',
    `**Scaling, in-process store** (hits cycling through ${SCALE_CYCLE_NOTE}; ratio = p50 ÷ the same lookup's p50 with 1 k entries${quietNote(scaling)}):`,
    '',
    markdownTable(
      ['scenario', 'ops/s', 'p50 µs', 'p99 µs', 'p50 × at 1 k', 'target'],
      scaling.map((r) => [
        scenarioCell(r),
        fmt(r.opsPerSec, 0),
        fmt(r.p50Us, 2),
        fmt(r.p99Us, 2),
        ratioCell(r.ratio, r.range),
        verdict(r),
      ]),
    ),
  ].join('\n');
}

export function datatableTable(rows: readonly DatatableRow[]): string {
  const compare = (r: DatatableRow) =>
    r.id === r.baseline
      ? 'baseline'
      : r.vsBaseline.kind === 'added'
        ? `+${fmt(r.vsBaseline.value)} µs`
        : `${fmt(r.vsBaseline.value, 2)}×`;
  return [
    '**Data tables** (real Postgres, scram logins; each row against the baseline of its group, same run):',
    '',
    markdownTable(
      ['scenario', 'ops', 'p50 µs', 'p99 µs', 'vs baseline', 'target'],
      rows.map((r) => [
        `\`${r.id}\` — ${r.label}`,
        String(r.ops),
        fmt(r.p50Us),
        fmt(r.p99Us),
        compare(r),
        r.target ? `${r.target.met ? '✅' : '❌'} ${r.target.text}` : '',
      ]),
    ),
  ].join('\n');
}

/** Connections of the HTTP throughput rows. */
export const HTTP_CONCURRENCY = 8;

/** One row of the HTTP table (`http_bench.ts` measures them, in a process of its own). */
export interface HttpRow {
  readonly id: string;
  readonly label: string;
  readonly p50Us: number;
  readonly p99Us: number;
  readonly ops: number;
  /** p50 ÷ `http_healthz` p50. */
  readonly ratio: number;
  /** p50 ÷ `http_fastify_get` p50 (the floor). */
  readonly floorRatio: number;
  /** Requests per second over `HTTP_CONCURRENCY` connections. */
  readonly reqPerSec: number;
  /** req/s ÷ the floor's req/s. */
  readonly floorThroughput: number;
  /**
   * CPU time (user + system) of the servers' process per request, over `HTTP_CONCURRENCY`
   * connections. Steadier than latency on a shared machine: another tenant's load delays a
   * request but does not add to this process's CPU.
   */
  readonly cpuUs: number;
}

/**
 * What a cached request is judged against: the floor route's p50 and req/s, same run. With the
 * server's defaults (two tiers) p50 ≤ 1.0×; with Redis only ≤ 1.2× (SPEC "Performance").
 */
export const HTTP_MAX_FLOOR_RATIO: Record<string, number> = {
  http_cached: 1.0,
  http_cached_no_access_log: 1.0,
  http_cached_redis_only: 1.2,
};
export const HTTP_MIN_FLOOR_THROUGHPUT = 0.85;

export function httpTable(rows: readonly HttpRow[]): string {
  const target = (r: HttpRow) => {
    const max = HTTP_MAX_FLOOR_RATIO[r.id];
    if (max === undefined) return '';
    const p50 = r.floorRatio <= max;
    const rate = r.floorThroughput >= HTTP_MIN_FLOOR_THROUGHPUT;
    return (
      `${p50 ? '✅' : '❌'} p50 ≤ ${max}× floor; ` +
      `${rate ? '✅' : '❌'} req/s ≥ ${HTTP_MIN_FLOOR_THROUGHPUT}× floor`
    );
  };
  return [
    `**HTTP, reference server** (servers in one process, their client in another; p50 and p99 over one keep-alive connection, req/s and the servers' CPU per request over ${HTTP_CONCURRENCY}; ratios against the floor route, \`http_fastify_get\`, same run):`,
    '',
    markdownTable(
      [
        'scenario',
        'p50 µs',
        'p99 µs',
        'p50 × floor',
        'req/s',
        'req/s × floor',
        'CPU µs/req',
        'target',
      ],
      rows.map((r) => [
        `\`${r.id}\` — ${r.label}`,
        fmt(r.p50Us),
        fmt(r.p99Us),
        fmt(r.floorRatio, 2),
        fmt(r.reqPerSec, 0),
        fmt(r.floorThroughput, 2),
        fmt(r.cpuUs),
        target(r),
      ]),
    ),
  ].join('\n');
}

export function envLine(env: Environment): string {
  return (
    `${env.date} · Node ${env.node} · Redis ${env.redis} · Postgres ${env.postgres} · ` +
    `${env.cpu}, ${env.cores} cores · load ${env.load}`
  );
}
