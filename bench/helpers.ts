/**
 * The benchmark harness. The machine is shared and noisy, so absolute numbers drift from run to
 * run; what is stable is the *ratio* of two scenarios measured side by side. Hence:
 *
 * - scenarios of one comparison are measured **interleaved in rounds** (A,B,C,A,B,C,…, starting
 *   one further along each round), so a noisy second hits all of them alike;
 * - every op is timed on its own with `process.hrtime.bigint()` (≈ 0.05 µs per pair of reads,
 *   included in every figure alike), and we report p50/p99, not the mean;
 * - each row carries its ratio to a baseline measured in the same run;
 * - rounds are grouped in **blocks** (ten by default): a block during which the machine's other
 *   processes used more than a set share of its CPU is dropped, and each row's ratio is the
 *   median of its per-block ratios, reported with their range (see {@link QuietPlan}).
 *
 * Dependency-free on purpose: tinybench runs one task to completion before the next, which lets
 * a burst of noise land on a single row.
 */

import { OtherCpu } from './machine_cpu.js';

const { hrtime } = process;

/** One thing to measure. `op(i)` is called with a per-scenario counter (to cycle viewers). */
export interface Scenario {
  /** `tier_operation`, e.g. `redis_hit`; stable across runs (used in latest.json). */
  readonly id: string;
  /** Human description for the table. */
  readonly label: string;
  /** `true` when `op` returns a promise that must be awaited. */
  readonly async: boolean;
  readonly op: (i: number) => unknown;
  /** Throws when the scenario did not measure what it claims (e.g. a "hit" executed). */
  readonly verify?: () => void;
}

/**
 * Which blocks of rounds count. Measured per block (a run of consecutive rounds, every scenario
 * in each): the share of all cores' time that processes other than this one and `ours` used.
 * The outsider harness (`outsider_http.ts`) judges its rounds the same way.
 */
export interface QuietPlan {
  /** Rounds are grouped into this many blocks (at most one per round). @default 10 */
  readonly blocks?: number;
  /** A block is kept when others used at most this share of the machine (1: keep all). @default 0.15 */
  readonly maxOther?: number;
  /** Processes whose CPU is part of the measured work, e.g. the local Redis server. */
  readonly ours?: readonly number[];
}

/** How the blocks of one measurement fared: the same object on every scenario's stats. */
export interface QuietReport {
  readonly blocks: number;
  readonly kept: number;
  readonly maxOther: number;
  /** Others' share of the machine in each block, kept or not. */
  readonly others: readonly number[];
  /** Every block was too busy: the figures are from all of them, and say so. */
  readonly allDropped: boolean;
}

/** Latency of one scenario, one caller at a time (over the kept blocks). */
export interface LatencyStats {
  readonly ops: number;
  /** Ops per second of wall time over the measured batches (one caller). */
  readonly opsPerSec: number;
  readonly p50Us: number;
  readonly p99Us: number;
  /**
   * The figure a ratio is taken of, per kept block, in block order: p50 µs (one caller) or
   * ops/s (concurrent callers). Two scenarios' blocks ran side by side, so they pair up.
   */
  readonly perBlock: readonly number[];
  readonly quiet: QuietReport;
}

/** Throughput of one scenario with N concurrent callers. */
export interface ThroughputStats extends LatencyStats {
  readonly concurrency: number;
}

export interface LatencyPlan {
  /** Warm-up time per scenario (interleaved too), before anything is recorded. */
  readonly warmupMs: number;
  readonly rounds: number;
  /** Time each scenario runs per round. */
  readonly roundMs: number;
  /** At least this many ops per scenario per round, however slow. */
  readonly minOpsPerRound: number;
  readonly quiet?: QuietPlan;
}

export interface ThroughputPlan {
  readonly concurrency: number;
  /** Ops per scenario per round: the fixed amount of work timed end to end. */
  readonly opsPerRound: number;
  readonly warmupRounds: number;
  readonly rounds: number;
  readonly quiet?: QuietPlan;
}

const DEFAULT_BLOCKS = 10;
const DEFAULT_MAX_OTHER = 0.15;

/** Groups `rounds` into blocks and measures others' CPU over each. */
class Blocks {
  readonly count: number;
  readonly #rounds: number;
  readonly #maxOther: number;
  readonly #meter: OtherCpu;
  readonly #others: number[] = [];

  constructor(rounds: number, plan: QuietPlan | undefined) {
    this.#rounds = rounds;
    this.count = Math.max(1, Math.min(rounds, plan?.blocks ?? DEFAULT_BLOCKS));
    this.#maxOther = plan?.maxOther ?? DEFAULT_MAX_OTHER;
    this.#meter = new OtherCpu(plan?.ours ?? []);
  }

  of(round: number): number {
    return Math.floor((round * this.count) / this.#rounds);
  }

  /** Call before round `r` runs. */
  beforeRound(r: number): void {
    if (r === 0 || this.of(r - 1) !== this.of(r)) this.#meter.start();
  }

  /** Call after round `r` ran. */
  afterRound(r: number): void {
    if (r === this.#rounds - 1 || this.of(r + 1) !== this.of(r)) {
      this.#others.push(this.#meter.stop());
    }
  }

  /** The blocks that count, and the report every stat carries. */
  verdict(): { kept: number[]; report: QuietReport } {
    const quiet = this.#others.flatMap((other, b) => (other <= this.#maxOther ? [b] : []));
    const allDropped = quiet.length === 0;
    const kept = allDropped ? this.#others.map((_, b) => b) : quiet;
    return {
      kept,
      report: {
        blocks: this.count,
        kept: quiet.length,
        maxOther: this.#maxOther,
        others: this.#others.map((o) => Number(o.toFixed(3))),
        allDropped,
      },
    };
  }
}

const yieldToLoop = () => new Promise<void>((resolve) => setImmediate(resolve));

/** p-th percentile (0–1) of sorted nanosecond samples, in µs. */
function percentileUs(sorted: Float64Array, p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const index = Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1));
  return sorted[index]! / 1000;
}

/** Growable sample buffer: avoids a 100 k-element JS array of boxed numbers. */
class Samples {
  #data = new Float64Array(1 << 14);
  #length = 0;

  push(ns: number): void {
    if (this.#length === this.#data.length) {
      const next = new Float64Array(this.#data.length * 2);
      next.set(this.#data);
      this.#data = next;
    }
    this.#data[this.#length++] = ns;
  }

  get length(): number {
    return this.#length;
  }

  sorted(): Float64Array {
    return this.#data.slice(0, this.#length).sort();
  }

  /** These samples' values, in order (a view, not a copy). */
  values(): Float64Array {
    return this.#data.subarray(0, this.#length);
  }
}

/** All samples of `parts`, sorted. */
function pooledSorted(parts: readonly Samples[]): Float64Array {
  const out = new Float64Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p.values(), at);
    at += p.length;
  }
  return out.sort();
}

/** Runs ops of one scenario for `ns` nanoseconds (and at least `minOps`); returns wall ns. */
async function runBatch(
  scenario: Scenario,
  counter: { i: number },
  ns: bigint,
  minOps: number,
  samples: Samples | null,
): Promise<{ ops: number; wallNs: bigint }> {
  const { op } = scenario;
  const start = hrtime.bigint();
  const deadline = start + ns;
  let ops = 0;
  let end = start;
  if (scenario.async) {
    for (;;) {
      const t0 = hrtime.bigint();
      await op(counter.i++);
      end = hrtime.bigint();
      samples?.push(Number(end - t0));
      if (++ops >= minOps && end >= deadline) break;
    }
  } else {
    for (;;) {
      const t0 = hrtime.bigint();
      op(counter.i++);
      end = hrtime.bigint();
      samples?.push(Number(end - t0));
      if (++ops >= minOps && end >= deadline) break;
    }
  }
  return { ops, wallNs: end - start };
}

/** A small deterministic PRNG (mulberry32): the same seed, the same sequence. */
export function prng(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * Scenario order for round `r`: the rows of a Williams design, so that over one period (n rounds
 * for n scenarios, 2n when n is odd) every scenario runs once in every position *and* right
 * after every other scenario equally often. Which scenario plays which part is shuffled anew each
 * period (seeded by the period, so two runs visit the same orders).
 *
 * Why the second balance: a scenario pays for its predecessor's garbage (at 64 KiB, a collection
 * forced by its external buffers). The rotation of one shuffle per cycle that this replaces gave
 * each scenario the same predecessor for a whole cycle — at 64 KiB and 64 callers, 13 scenarios
 * and 40 rounds, that is three fixed pairings, the same in every run. With other seeds, the raw
 * `GET`'s twin row (`redis_keyed_get`, nothing of ours) read 0.75× to 0.99× the raw `GET`, and
 * `redis_hit` 0.74× to 1.06×: the row's verdict was its seeds'.
 */
export function roundOrder<T>(items: readonly T[], r: number): T[] {
  const n = items.length;
  if (n <= 1) return [...items];
  const period = roundPeriod(n);
  const random = prng(Math.floor(r / period) + 1);
  const cast = [...items];
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [cast[i], cast[j]] = [cast[j]!, cast[i]!];
  }
  // Row 0 is 0, 1, n−1, 2, n−2, …; row k adds k to each (mod n); an odd n's rows n to 2n−1
  // are rows 0 to n−1 reversed.
  const row = r % period;
  const shift = row % n;
  const order: T[] = [];
  for (let i = 0; i < n; i++) {
    const first = i === 0 ? 0 : i % 2 === 1 ? (i + 1) / 2 : n - i / 2;
    order.push(cast[(first + shift) % n]!);
  }
  if (row >= n) order.reverse();
  return order;
}

/** The fewest rounds, at least `atLeast`, that are whole periods of `roundOrder` for `n` items. */
export function wholePeriods(n: number, atLeast: number): number {
  const period = roundPeriod(n);
  return Math.max(1, Math.ceil(atLeast / period)) * period;
}

/** Rounds in one period of {@link roundOrder} for `n` items: n, or 2n when n is odd. */
function roundPeriod(n: number): number {
  return n <= 1 ? 1 : n % 2 === 0 ? n : 2 * n;
}

/**
 * Single-caller latency of every scenario, measured interleaved. Each scenario's counter carries
 * on from warm-up, so every op of the cycle (e.g. every viewer) is visited.
 */
export async function measureLatency(
  scenarios: readonly Scenario[],
  plan: LatencyPlan,
): Promise<Map<string, LatencyStats>> {
  const counters = new Map(scenarios.map((s) => [s.id, { i: 0 }]));
  const warmRounds = Math.max(1, Math.round(plan.warmupMs / plan.roundMs));
  const roundNs = BigInt(Math.round(plan.roundMs * 1e6));
  for (let r = 0; r < warmRounds; r++) {
    for (const s of roundOrder(scenarios, r)) {
      await runBatch(s, counters.get(s.id)!, roundNs, 1, null);
      await yieldToLoop();
    }
  }
  const blocks = new Blocks(plan.rounds, plan.quiet);
  const acc = new Map(
    scenarios.map((s) => [
      s.id,
      Array.from({ length: blocks.count }, () => ({ samples: new Samples(), ops: 0, wallNs: 0n })),
    ]),
  );
  for (let r = 0; r < plan.rounds; r++) {
    blocks.beforeRound(r);
    for (const s of roundOrder(scenarios, r)) {
      const a = acc.get(s.id)![blocks.of(r)]!;
      const { ops, wallNs } = await runBatch(
        s,
        counters.get(s.id)!,
        roundNs,
        plan.minOpsPerRound,
        a.samples,
      );
      a.ops += ops;
      a.wallNs += wallNs;
      // Lets sockets, timers and GC finalisers of this batch settle before the next scenario.
      await yieldToLoop();
    }
    blocks.afterRound(r);
  }
  const { kept, report } = blocks.verdict();
  const out = new Map<string, LatencyStats>();
  for (const s of scenarios) {
    s.verify?.();
    const parts = kept.map((b) => acc.get(s.id)![b]!);
    const sorted = pooledSorted(parts.map((p) => p.samples));
    const ops = parts.reduce((n, p) => n + p.ops, 0);
    const wallNs = parts.reduce((n, p) => n + p.wallNs, 0n);
    out.set(s.id, {
      ops,
      opsPerSec: (ops * 1e9) / Number(wallNs),
      p50Us: percentileUs(sorted, 0.5),
      p99Us: percentileUs(sorted, 0.99),
      perBlock: parts.map((p) => percentileUs(p.samples.sorted(), 0.5)),
      quiet: report,
    });
  }
  return out;
}

/** `concurrency` callers share `ops` ops of one scenario; resolves with the batch's wall time. */
async function runConcurrent(
  scenario: Scenario,
  counter: { i: number },
  concurrency: number,
  ops: number,
  samples: Samples | null,
): Promise<bigint> {
  let issued = 0;
  const { op } = scenario;
  const caller = async () => {
    while (issued < ops) {
      issued++;
      const t0 = hrtime.bigint();
      await op(counter.i++);
      samples?.push(Number(hrtime.bigint() - t0));
    }
  };
  const start = hrtime.bigint();
  const callers: Promise<void>[] = [];
  for (let c = 0; c < concurrency; c++) callers.push(caller());
  await Promise.all(callers);
  return hrtime.bigint() - start;
}

/**
 * Throughput with `plan.concurrency` concurrent callers: each round, each scenario (interleaved)
 * completes a fixed number of ops; ops/s is total ops over total wall time. p50/p99 here are the
 * latencies callers saw under that load.
 */
export async function measureThroughput(
  scenarios: readonly Scenario[],
  plan: ThroughputPlan,
): Promise<Map<string, ThroughputStats>> {
  const counters = new Map(scenarios.map((s) => [s.id, { i: 0 }]));
  for (let r = 0; r < plan.warmupRounds; r++) {
    for (const s of roundOrder(scenarios, r)) {
      await runConcurrent(s, counters.get(s.id)!, plan.concurrency, plan.opsPerRound, null);
      await yieldToLoop();
    }
  }
  const blocks = new Blocks(plan.rounds, plan.quiet);
  const acc = new Map(
    scenarios.map((s) => [
      s.id,
      Array.from({ length: blocks.count }, () => ({ samples: new Samples(), ops: 0, wallNs: 0n })),
    ]),
  );
  for (let r = 0; r < plan.rounds; r++) {
    blocks.beforeRound(r);
    for (const s of roundOrder(scenarios, r)) {
      const a = acc.get(s.id)![blocks.of(r)]!;
      a.wallNs += await runConcurrent(
        s,
        counters.get(s.id)!,
        plan.concurrency,
        plan.opsPerRound,
        a.samples,
      );
      a.ops += plan.opsPerRound;
      await yieldToLoop();
    }
    blocks.afterRound(r);
  }
  const { kept, report } = blocks.verdict();
  const out = new Map<string, ThroughputStats>();
  for (const s of scenarios) {
    s.verify?.();
    const parts = kept.map((b) => acc.get(s.id)![b]!);
    const ops = parts.reduce((n, p) => n + p.ops, 0);
    const wallNs = parts.reduce((n, p) => n + p.wallNs, 0n);
    const sorted = pooledSorted(parts.map((p) => p.samples));
    out.set(s.id, {
      concurrency: plan.concurrency,
      ops,
      opsPerSec: (ops * 1e9) / Number(wallNs),
      p50Us: percentileUs(sorted, 0.5),
      p99Us: percentileUs(sorted, 0.99),
      perBlock: parts.map((p) => (p.ops * 1e9) / Number(p.wallNs)),
      quiet: report,
    });
  }
  return out;
}

/** Fails the run loudly: a benchmark that measured the wrong thing must not print a table. */
export class BenchInvariantError extends Error {
  override readonly name = 'BenchInvariantError';
}

/** Formats a number with a sensible precision for a table cell. */
export function fmt(value: number, digits = 1): string {
  if (!Number.isFinite(value)) return 'n/a';
  if (Math.abs(value) >= 10_000) return Math.round(value).toLocaleString('en-US');
  return value.toFixed(digits);
}

/** A GitHub-flavoured Markdown table. */
export function markdownTable(header: readonly string[], rows: readonly (readonly string[])[]) {
  const right = header.map((h) => /ops\/s|µs|×|ratio/.test(h));
  const line = (cells: readonly string[]) => `| ${cells.join(' | ')} |`;
  return [
    line(header),
    line(header.map((_, i) => (right[i] ? '---:' : '---'))),
    ...rows.map(line),
  ].join('\n');
}
