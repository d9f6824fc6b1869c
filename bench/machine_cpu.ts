/**
 * How busy the rest of the machine was while something was measured: the share of all cores'
 * time that processes *other than* the measured ones spent running (from /proc). On a shared
 * machine a neighbour's burst lands on one side of a ratio; a stretch of rounds during which
 * others ran much is dropped rather than averaged in (see `helpers.ts`, `outsider_http.ts`).
 */
import { readFileSync } from 'node:fs';

/** Busy and total jiffies of the whole machine (all cores). */
export function machineJiffies(): { busy: number; total: number } {
  const line = readFileSync('/proc/stat', 'utf8').split('\n', 1)[0]!;
  const f = line.trim().split(/\s+/).slice(1).map(Number);
  // user nice system idle iowait irq softirq steal
  const idle = (f[3] ?? 0) + (f[4] ?? 0);
  const total = f.slice(0, 8).reduce((a, b) => a + b, 0);
  return { busy: total - idle, total };
}

/** Jiffies per second of /proc's process times (USER_HZ: 100 on Linux). */
export const CLOCK_TICKS = 100;

/** utime + stime of a process, in jiffies. */
export function processJiffies(pid: number | 'self'): number {
  const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // Fields after the command name (which may hold spaces) start after the last ')'.
  const rest = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return Number(rest[11]) + Number(rest[12]);
}

/** The command name of a local process, or `null` when /proc does not show it. */
function processName(pid: number): string | null {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return text.slice(text.indexOf('(') + 1, text.lastIndexOf(')'));
  } catch {
    return null;
  }
}

/**
 * The pid of the Redis server behind `info` (the text of `INFO server`) when it runs on this
 * machine, else `null`: its CPU serves the measured GETs, so it is not "another process".
 */
export function localRedisPid(info: string): number | null {
  const pid = Number(/process_id:(\d+)/.exec(info)?.[1]);
  if (!Number.isInteger(pid) || pid <= 0) return null;
  return processName(pid)?.startsWith('redis') ? pid : null;
}

/** Measures others' share of the machine between `start()` and `stop()`. */
export class OtherCpu {
  readonly #ours: readonly (number | 'self')[];
  #machine = { busy: 0, total: 0 };
  #own = 0;

  /** `pids`: the processes whose CPU is the measured work (this one is always among them). */
  constructor(pids: readonly number[] = []) {
    this.#ours = ['self', ...pids];
  }

  start(): void {
    this.#machine = machineJiffies();
    this.#own = this.#ownJiffies();
  }

  /** Others' CPU since `start()`, as a share (0–1) of all cores' time. */
  stop(): number {
    const machine = machineJiffies();
    const own = this.#ownJiffies() - this.#own;
    const busy = machine.busy - this.#machine.busy;
    return Math.max(0, busy - own) / Math.max(1, machine.total - this.#machine.total);
  }

  #ownJiffies(): number {
    let sum = 0;
    for (const pid of this.#ours) {
      try {
        sum += processJiffies(pid);
      } catch {
        // A process that is gone has no more CPU to count.
      }
    }
    return sum;
  }
}
