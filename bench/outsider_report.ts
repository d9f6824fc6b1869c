/**
 * `npm run bench`'s outsider sections: each script in a process of its own (`--json`), and its
 * table. `outsider_http.ts` — the HTTP hit against the Fastify floor under autocannon, rounds
 * kept only when the rest of the machine was quiet; `queue_miss_work.ts` — the PostgreSQL
 * transactions and Redis commands one queued miss costs.
 */
import { spawn } from 'node:child_process';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const BENCH_DIR = dirname(fileURLToPath(import.meta.url));

export interface OutsiderHttp {
  readonly date: string;
  readonly load: string;
  readonly rounds: number;
  readonly dropped: number;
  readonly allDropped: boolean;
  readonly maxOther: number;
  /** The share of the CPU other processes used in each round. */
  readonly othersPerRound: readonly number[];
  readonly seconds: number;
  readonly rows: readonly {
    readonly id: string;
    readonly conns: number;
    readonly reqPerS: { median: number; min: number; max: number };
    readonly p50Ms: { median: number; min: number; max: number };
    readonly reqPerSVsFloor: number;
    readonly p50VsFloor: number;
    readonly cpuUsPerReq: { median: number; min: number; max: number };
    readonly cpuVsFloor: number;
    /** The server process's write syscalls per request (median); absent from older dumps. */
    readonly writesPerReq?: number;
    /** Sealed subjects (Redis only): the same ratios against the sealed floor route. */
    readonly reqPerSVsSealedFloor?: number;
    readonly p50VsSealedFloor?: number;
  }[];
}

export interface QueueWork {
  readonly n: number;
  readonly rows: readonly { label: string; pg: number; redis: number; byCommand: string }[];
}

/** Runs `bench/<file> --json …args` in a process of its own; its last stdout line, parsed. */
export function benchAlone<T>(file: string, args: readonly string[]): Promise<T> {
  return new Promise((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [...process.execArgv, join(BENCH_DIR, file), '--json', ...args],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => {
      out += chunk.toString('utf8');
    });
    child.on('error', reject);
    child.on('exit', (code) => {
      const last = out.trim().split('\n').at(-1) ?? '';
      if (code === 0 && last.startsWith('{')) resolve(JSON.parse(last) as T);
      else reject(new Error(`bench/${file} exited with ${code}`));
    });
  });
}

const TARGETS: Record<string, string> = {
  floor: 'floor: Fastify, bearer check + one Redis `GET` of the same bytes',
  sealedFloor:
    'sealed floor: the same route, + HMAC of the key text and the AES-256-GCM open of a sealed entry',
  cached: 'app request, cache hit, two tiers (the default)',
  redisOnly: 'app request, cache hit, Redis only',
  accessRecord: 'app request, cache hit, two tiers, access record on',
  cachedBaseline: 'the same, two tiers, built from `--baseline`',
  redisOnlyBaseline: 'the same, Redis only, built from `--baseline`',
};

export function outsiderHttpTable(r: OutsiderHttp): string {
  const f = (x: number, d = 2) => (Number.isFinite(x) ? x.toFixed(d) : '—');
  const sealedRatio = (x: number | undefined) => (x === undefined ? '' : ` (sealed: ${f(x)})`);
  const kept = r.allDropped
    ? `**every round dropped** (the machine was busy): the figures are from all ${r.rounds}, not to be trusted`
    : `${r.rounds - r.dropped} of ${r.rounds} rounds kept`;
  const lines = [
    `**HTTP as an outsider measures it** (\`bench/outsider_http.ts\`: autocannon in a process of its own, ${r.seconds} s per cell, cells interleaved; a round is kept when other processes used ≤ ${r.maxOther * 100} % of the CPU; ${kept}; ${r.date}, load ${r.load}). Targets: req/s ≥ 0.85 × the floor, p50 ≤ 1.0 × (Redis only ≤ 1.2 ×). Redis only serves sealed entries (the server's default for a shared store), so its row also reads against the sealed floor route, in brackets.`,
    '',
    '| target | conns | req/s, median (range) | p50 ms, median (range) | req/s ÷ floor | p50 ÷ floor | server CPU µs/req (range) | CPU ÷ floor | server writes/req |',
    '| --- | ---: | --- | --- | ---: | ---: | --- | ---: | ---: |',
  ];
  for (const row of r.rows) {
    lines.push(
      `| ${TARGETS[row.id] ?? row.id} | ${row.conns} | ${f(row.reqPerS.median, 0)} (${f(row.reqPerS.min, 0)}–${f(row.reqPerS.max, 0)}) | ${f(row.p50Ms.median)} (${f(row.p50Ms.min)}–${f(row.p50Ms.max)}) | ${f(row.reqPerSVsFloor)}${sealedRatio(row.reqPerSVsSealedFloor)} | ${f(row.p50VsFloor)}${sealedRatio(row.p50VsSealedFloor)} | ${f(row.cpuUsPerReq.median, 1)} (${f(row.cpuUsPerReq.min, 1)}–${f(row.cpuUsPerReq.max, 1)}) | ${f(row.cpuVsFloor)} | ${f(row.writesPerReq ?? Number.NaN)} |`,
    );
  }
  return lines.join('\n');
}

export function queueWorkTable(r: QueueWork): string {
  const lines = [
    `**Work per queued miss** (\`bench/queue_miss_work.ts\`: a private \`redis-server\`, \`pg_stat_database\` and \`INFO commandstats\` deltas over ${r.n} sequential misses; counts, not times)`,
    '',
    '| per miss | PostgreSQL transactions | Redis commands |',
    '| --- | ---: | ---: |',
  ];
  for (const row of r.rows)
    lines.push(`| ${row.label} | ${row.pg.toFixed(2)} | ${row.redis.toFixed(1)} |`);
  return lines.join('\n');
}
