/**
 * The HTTP rows measured as an outsider would: `npx tsx bench/outsider_http.ts [--rounds 6]
 * [--seconds 3] [--conns 16,64] [--max-other 0.15] [--profile DIR] [--json]` (DATABASE_URL and
 * REDIS_URL as elsewhere).
 *
 * The servers run in a process of their own (`outsider_server.ts`); the load comes from
 * autocannon in this one. Every target (the floor, the sealed floor — the floor route plus the
 * HMAC and AES-256-GCM open a sealed entry needs, which Redis only is also read against — the
 * cached app request with two tiers, the same with Redis only, the default with the access record
 * on) at every connection count runs once per round, in `roundOrder`'s order (a Williams
 * design, cast anew each period), and a round is kept only when the machine's *other* processes
 * used at most `--max-other` of its CPU during it (from /proc/stat, less this process's and the server
 * process's own /proc/<pid>/stat): on a shared machine a neighbour's burst otherwise lands on
 * one side of a ratio. It reports, per row, the median over the kept rounds with the range, the
 * ratios to the floor of the same round, the server process's CPU time per request (which a
 * busy machine disturbs far less than req/s and latency), and how many rounds it dropped. When every round is
 * dropped it says so and reports them all, marked.
 *
 * `--targets floor,cached`: only those (without the floor, no ratios: to profile one route).
 * `--baseline DIR`: also the cached request (two tiers, and Redis only) of the servers built from
 * the checkout in DIR (`git archive <commit> | tar -x -C DIR`, `node_modules` linked in), in the
 * same process and the same rounds: before/after ratios from one run (`cachedBaseline`,
 * `redisOnlyBaseline`).
 * `--profile DIR`: the server process runs with `--cpu-prof` into DIR, and its top frames by
 * self time are printed at the end.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import autocannon from 'autocannon';
import { roundOrder } from './helpers.js';
import { CLOCK_TICKS, machineJiffies, processJiffies } from './machine_cpu.js';
import { type OutsiderHttp, outsiderHttpTable } from './outsider_report.js';

const SERVER = fileURLToPath(new URL('./outsider_server.ts', import.meta.url));

function arg(name: string, fallback: string): string {
  const at = process.argv.indexOf(`--${name}`);
  return at === -1 ? fallback : (process.argv[at + 1] ?? fallback);
}
const ROUNDS = Number(arg('rounds', '6'));
const SECONDS = Number(arg('seconds', '3'));
const CONNS = arg('conns', '16,64').split(',').map(Number);
const MAX_OTHER = Number(arg('max-other', '0.15'));
const PROFILE = arg('profile', '');
const BASELINE = arg('baseline', '');
const JSON_OUT = process.argv.includes('--json');

interface Ready {
  readonly targets: Record<
    'floor' | 'sealedFloor' | 'cached' | 'redisOnly' | 'accessRecord',
    string
  > &
    Partial<Record<'cachedBaseline' | 'redisOnlyBaseline', string>>;
  readonly token: string;
  readonly tokenRedisOnly: string;
  readonly tokenAccessRecord: string;
  readonly body: string;
}

/** Write syscalls (write, writev, …) a process has made so far (`/proc/<pid>/io`). */
function processWrites(pid: number): number {
  return Number(/^syscw: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))?.[1]);
}

async function startServer(): Promise<{ child: ChildProcess; ready: Ready }> {
  const flags = ['--import', 'tsx'];
  if (PROFILE) flags.push('--cpu-prof', `--cpu-prof-dir=${PROFILE}`);
  const child = spawn(process.execPath, [...flags, SERVER], {
    env: {
      ...process.env,
      VC_BENCH_LOG_LEVEL: process.env['VC_BENCH_LOG_LEVEL'] ?? 'info',
      VC_OUTSIDER_BASELINE: BASELINE,
    },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const ready = await new Promise<Ready>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      if (line.startsWith('{"targets"')) resolve(JSON.parse(line) as Ready);
    });
    child.once('exit', (code) => reject(new Error(`server process exited ${code}`)));
  });
  return { child, ready };
}

interface Sample {
  readonly reqPerS: number;
  readonly p50Ms: number;
  readonly p99Ms: number;
  /** The server process's CPU time per request (user + system), µs: robust to a busy machine. */
  readonly cpuUsPerReq: number;
  /**
   * The server process's write syscalls per request: one per response at best (a loopback write
   * is among the costliest steps of a hit), plus what its Redis commands take.
   */
  readonly writesPerReq: number;
}

function load(url: string, token: string, body: string, connections: number): Promise<Sample> {
  // autocannon's own latency histogram keeps whole milliseconds: a hit's p50 is below one.
  const times: number[] = [];
  return new Promise((resolve, reject) => {
    const instance = autocannon(
      {
        url,
        method: 'POST',
        connections,
        duration: SECONDS,
        headers: { authorization: `Bearer ${token}`, 'content-type': 'application/json' },
        body,
      },
      (err, result) => {
        if (err) return reject(err);
        if (result.non2xx > 0 || result.errors > 0)
          return reject(new Error(`${url}: ${result.non2xx} non-2xx, ${result.errors} errors`));
        const sorted = Float64Array.from(times).sort();
        const at = (q: number) =>
          sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))]!;
        resolve({
          reqPerS: result.requests.average,
          p50Ms: at(0.5),
          p99Ms: at(0.99),
          cpuUsPerReq: 0,
          writesPerReq: 0,
        });
      },
    );
    instance.on('response', (_client, _status, _bytes, ms) => times.push(ms));
  });
}

const median = (xs: number[]) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};

const { child, ready } = await startServer();
const subjects = [
  { id: 'floor', url: ready.targets.floor, token: ready.token },
  { id: 'sealedFloor', url: ready.targets.sealedFloor, token: ready.token },
  { id: 'cached', url: ready.targets.cached, token: ready.token },
  { id: 'redisOnly', url: ready.targets.redisOnly, token: ready.tokenRedisOnly },
  { id: 'accessRecord', url: ready.targets.accessRecord, token: ready.tokenAccessRecord },
  // With --baseline: the same servers built from another checkout (the same demo tokens).
  ...(ready.targets.cachedBaseline === undefined
    ? []
    : [
        { id: 'cachedBaseline', url: ready.targets.cachedBaseline, token: ready.token },
        { id: 'redisOnlyBaseline', url: ready.targets.redisOnlyBaseline!, token: ready.token },
      ]),
];
const wanted = new Set(
  arg(
    'targets',
    `floor,sealedFloor,cached,redisOnly,accessRecord${BASELINE ? ',cachedBaseline,redisOnlyBaseline' : ''}`,
  ).split(','),
);
// Every ratio is to the floor of the same round (leave it out only to profile a route alone).
const cells = CONNS.flatMap((conns) =>
  subjects.filter((s) => wanted.has(s.id)).map((s) => ({ ...s, conns })),
);
type Round = { kept: boolean; other: number; samples: Map<string, Sample> };
const rounds: Round[] = [];
try {
  // Warm-up: one short pass of every cell, not kept.
  for (const c of cells) await load(c.url, c.token, ready.body, c.conns);
  for (let r = 0; r < ROUNDS; r++) {
    const m0 = machineJiffies();
    const own0 = processJiffies('self') + processJiffies(child.pid!);
    const samples = new Map<string, Sample>();
    const order = roundOrder(cells, r);
    for (const c of order) {
      const cpu0 = processJiffies(child.pid!);
      const writes0 = processWrites(child.pid!);
      const sample = await load(c.url, c.token, ready.body, c.conns);
      const jiffies = processJiffies(child.pid!) - cpu0;
      const writes = processWrites(child.pid!) - writes0;
      const requests = Math.max(1, sample.reqPerS * SECONDS);
      samples.set(`${c.id}@${c.conns}`, {
        ...sample,
        cpuUsPerReq: (jiffies * (1e6 / CLOCK_TICKS)) / requests,
        writesPerReq: writes / requests,
      });
    }
    const m1 = machineJiffies();
    const own1 = processJiffies('self') + processJiffies(child.pid!);
    const other = Math.max(0, m1.busy - m0.busy - (own1 - own0)) / Math.max(1, m1.total - m0.total);
    rounds.push({ kept: other <= MAX_OTHER, other, samples });
    process.stderr.write(
      `round ${r + 1}/${ROUNDS}: others ${(other * 100).toFixed(0)} % of ${cpus().length} cores\n`,
    );
  }
} finally {
  child.kill('SIGTERM');
  await new Promise((resolve) => child.once('exit', resolve));
}

const kept = rounds.filter((r) => r.kept);
const used = kept.length > 0 ? kept : rounds;
const rows = cells.map((c) => {
  const key = `${c.id}@${c.conns}`;
  const get = (pick: (s: Sample) => number, k = key) => used.map((r) => pick(r.samples.get(k)!));
  const rps = get((s) => s.reqPerS);
  const p50 = get((s) => s.p50Ms);
  const ratio = (pick: (s: Sample) => number, floorId = 'floor') =>
    used.map((r) => {
      const floor = r.samples.get(`${floorId}@${c.conns}`);
      return floor === undefined ? Number.NaN : pick(r.samples.get(key)!) / pick(floor);
    });
  // Sealed subjects (Redis only opens a sealed entry per hit) also against the sealed floor.
  const sealed = c.id === 'redisOnly' || c.id === 'redisOnlyBaseline';
  const rpsRatio = ratio((s) => s.reqPerS);
  const cpu = get((s) => s.cpuUsPerReq);
  const cpuRatio = ratio((s) => s.cpuUsPerReq);
  const writes = get((s) => s.writesPerReq);
  const p50Ratio = ratio((s) => s.p50Ms);
  return {
    id: c.id,
    conns: c.conns,
    reqPerS: { median: median(rps), min: Math.min(...rps), max: Math.max(...rps) },
    p50Ms: { median: median(p50), min: Math.min(...p50), max: Math.max(...p50) },
    reqPerSVsFloor: median(rpsRatio),
    cpuUsPerReq: { median: median(cpu), min: Math.min(...cpu), max: Math.max(...cpu) },
    cpuVsFloor: median(cpuRatio),
    writesPerReq: median(writes),
    p50VsFloor: median(p50Ratio),
    ...(sealed
      ? {
          reqPerSVsSealedFloor: median(ratio((s) => s.reqPerS, 'sealedFloor')),
          p50VsSealedFloor: median(ratio((s) => s.p50Ms, 'sealedFloor')),
        }
      : {}),
  };
});
const summary: OutsiderHttp = {
  date: new Date().toISOString(),
  load: readFileSync('/proc/loadavg', 'utf8').split(' ').slice(0, 3).join(' '),
  rounds: rounds.length,
  dropped: rounds.length - kept.length,
  allDropped: kept.length === 0,
  maxOther: MAX_OTHER,
  othersPerRound: rounds.map((r) => Number(r.other.toFixed(3))),
  seconds: SECONDS,
  rows,
};
process.stdout.write(`${JSON_OUT ? JSON.stringify(summary) : outsiderHttpTable(summary)}\n`);
if (PROFILE) printTopFrames(PROFILE);
process.exit(0);

/** The top frames by self time of the newest profile in `dir`. */
function printTopFrames(dir: string): void {
  // The main thread's profile (tsx's loader thread writes a small one of its own).
  const file = readdirSync(dir)
    .filter((n) => n.endsWith('.cpuprofile'))
    .sort((a, b) => statSync(join(dir, a)).size - statSync(join(dir, b)).size)
    .pop();
  if (file === undefined) return;
  const profile = JSON.parse(readFileSync(join(dir, file), 'utf8')) as {
    nodes: { id: number; callFrame: { functionName: string; url: string; lineNumber: number } }[];
    samples: number[];
  };
  const byId = new Map(profile.nodes.map((n) => [n.id, n]));
  const self = new Map<string, number>();
  for (const id of profile.samples) {
    const n = byId.get(id)!;
    const where = n.callFrame.url.replace(/^.*node_modules\//, '').replace(/^.*\/src\//, 'src/');
    const key = `${n.callFrame.functionName || '(anonymous)'} ${where}:${n.callFrame.lineNumber + 1}`;
    self.set(key, (self.get(key) ?? 0) + 1);
  }
  const total = profile.samples.length;
  process.stdout.write(`\ntop frames by self time (${file}, ${total} samples):\n`);
  // Idle and start-up frames are not the requests': shares are of the rest.
  const busy = [...self].filter(([k]) => !k.startsWith('(idle)') && !k.startsWith('(program)'));
  const busyTotal = busy.reduce((a, [, n]) => a + n, 0);
  process.stdout.write(`(shares of ${busyTotal} non-idle samples)\n`);
  for (const [key, n] of busy.sort((a, b) => b[1] - a[1]).slice(0, 25)) {
    process.stdout.write(`${((n / busyTotal) * 100).toFixed(1).padStart(5)} %  ${key}\n`);
  }
}
