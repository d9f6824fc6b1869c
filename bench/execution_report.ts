/**
 * The execution rows: where a miss runs — through the queue (`queue_bench.ts`) or on
 * an agent worker (`agent_bench.ts`) — against the same miss in process, measured in the same
 * run. Each scenario file runs in a process of its own (its workers are processes too) and hands
 * its rows back as one JSON line; this module runs them and draws their table.
 */
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { fmt, markdownTable } from './helpers.js';

const BENCH_DIR = dirname(fileURLToPath(import.meta.url));

/** One row: a figure of the path measured beside its baseline (in process, or 1 worker). */
export interface ExecutionRow {
  readonly id: string;
  readonly label: string;
  /** `ms` for latencies (lower is better), `/s` for throughput (higher is better). */
  readonly unit: 'ms' | '/s';
  readonly baselineLabel: string;
  readonly baseline: number;
  readonly value: number;
  /** value ÷ baseline. */
  readonly ratio: number;
  /** The lowest and highest of the per-round ratios `ratio` is the median of, if paired. */
  readonly range?: readonly [number, number];
  /**
   * `value` is itself a time added over something else (the queued miss over in process): the
   * table shows no "added" over the baseline for it, which would read as that time.
   */
  readonly valueIsAdded?: boolean;
}

/** A latency row (ms) or a throughput row (/s), its ratio computed. */
export function executionRow(
  id: string,
  label: string,
  unit: ExecutionRow['unit'],
  baselineLabel: string,
  baseline: number,
  value: number,
): ExecutionRow {
  return { id, label, unit, baselineLabel, baseline, value, ratio: value / baseline };
}

/**
 * A throughput row measured in rounds, each round running the baseline and the subject once:
 * `baseline` and `value` are the medians of their rates, `ratio` the median of the rounds'
 * own ratios (what one round's noise does falls on its pair only), `range` theirs.
 */
export function pairedRow(
  id: string,
  label: string,
  baselineLabel: string,
  baselines: readonly number[],
  values: readonly number[],
): ExecutionRow {
  if (baselines.length === 0 || baselines.length !== values.length)
    throw new Error(`${id}: ${values.length} rounds measured against ${baselines.length}`);
  const ratios = values.map((v, i) => v / baselines[i]!);
  return {
    id,
    label,
    unit: '/s',
    baselineLabel,
    baseline: median(baselines),
    value: median(values),
    ratio: median(ratios),
    range: [Math.min(...ratios), Math.max(...ratios)],
  };
}

/** A row's ratio as a table shows it (`unit` after the figure), with its rounds' range if any. */
export function ratioText(row: Pick<ExecutionRow, 'ratio' | 'range'>, unit = ''): string {
  const ratio = `${fmt(row.ratio, 2)}${unit}`;
  return row.range === undefined
    ? ratio
    : `${ratio} (${fmt(row.range[0], 2)}–${fmt(row.range[1], 2)})`;
}

/** The median of some numbers (the mean of the middle two for an even count). */
export function median(xs: readonly number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = sorted.length >> 1;
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2;
}

/** p-quantile of an ascending array (nearest rank). */
export function quantile(sorted: readonly number[], q: number): number {
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!;
}

const cell = (unit: ExecutionRow['unit'], v: number) =>
  unit === 'ms' ? `${fmt(v, 2)} ms` : `${fmt(v, 0)}/s`;

export function executionTable(rows: readonly ExecutionRow[]): string {
  return [
    '**Execution: a miss through the queue or an agent worker** (workers are processes of their own; ratio = the row ÷ its baseline, same run; a figure to read, not a target):',
    '',
    markdownTable(
      ['scenario', 'baseline', 'measured', 'added', 'ratio ×'],
      rows.map((r) => [
        `\`${r.id}\` — ${r.label}`,
        `${r.baselineLabel}: ${cell(r.unit, r.baseline)}`,
        cell(r.unit, r.value),
        r.unit === 'ms' && r.valueIsAdded !== true
          ? `${r.value >= r.baseline ? '+' : '−'}${fmt(Math.abs(r.value - r.baseline), 2)} ms`
          : '',
        ratioText(r),
      ]),
    ),
  ].join('\n');
}

/**
 * Runs `bench/<file>` in a fresh process with `--json` (and `--quick`), and returns the rows of
 * its last output line. Its progress goes to stderr, shown as it comes.
 */
export function executionBenchAlone(
  file: string,
  quick: boolean,
  env: NodeJS.ProcessEnv = process.env,
): Promise<ExecutionRow[]> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [...process.execArgv, join(BENCH_DIR, file), '--json', ...(quick ? ['--quick'] : [])],
      { env, stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString('utf8');
    });
    child.on('error', reject);
    child.on('exit', (code) => {
      const last = out.trim().split('\n').at(-1) ?? '';
      if (code === 0 && last.startsWith('[')) resolve(JSON.parse(last) as ExecutionRow[]);
      else reject(new Error(`bench/${file} exited with ${code}`));
    });
  });
}

/** What a scenario file prints when run by hand (a table), or under `npm run bench` (JSON). */
export function printExecutionRows(rows: readonly ExecutionRow[]): void {
  console.log(process.argv.includes('--json') ? JSON.stringify(rows) : executionTable(rows));
}
