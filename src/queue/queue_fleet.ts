import { fleetCounts, HEARTBEAT_TTL_MS } from './queue_names.js';

/** How long one read of the fleet answers a miss's "is anyone taking this queue?". */
export const FLEET_FRESH_MS = 1000;

/** The Redis calls a fleet view makes (ioredis `Redis` or `Cluster`). */
export interface FleetRedis {
  zrangebyscore(key: string, min: number | string, max: number | string): Promise<string[]>;
}

/**
 * What a server knows of the takers (database workers, servers taking for agents) of every
 * workspace/group queue: one `ZRANGEBYSCORE` of the fleet set answers for all of them, and its
 * answer is kept {@link FLEET_FRESH_MS}, so a miss on a queue known to be taken costs no round
 * trip (a stale "taken" is used at once and refreshed behind it). Reads in flight are shared.
 */
export class FleetView {
  readonly #redis: FleetRedis;
  readonly #key: string;
  readonly #timeoutMs: number;
  #counts: Map<string, number> | null = null;
  #at = 0;
  #reading: Promise<Map<string, number>> | null = null;

  constructor(redis: FleetRedis, key: string, timeoutMs: number) {
    this.#redis = redis;
    this.#key = key;
    this.#timeoutMs = timeoutMs;
  }

  /**
   * Live takers of `slot` (`<workspace>/<group>`) as last read, without a round trip, when that
   * read says some; null when it is unknown or said none (ask {@link read}).
   */
  known(slot: string): number | null {
    const n = this.#counts?.get(slot) ?? 0;
    if (n === 0) return null;
    if (Date.now() - this.#at >= FLEET_FRESH_MS) void this.read().catch(() => {});
    return n;
  }

  /** Reads the fleet now (shared with a read in flight); rejects after the timeout. */
  read(): Promise<Map<string, number>> {
    this.#reading ??= this.#ask().finally(() => {
      this.#reading = null;
    });
    return this.#reading;
  }

  async #ask(): Promise<Map<string, number>> {
    let timer: NodeJS.Timeout | undefined;
    try {
      const members = await Promise.race([
        this.#redis.zrangebyscore(this.#key, Date.now() - HEARTBEAT_TTL_MS, '+inf'),
        new Promise<never>((_, reject) => {
          timer = setTimeout(() => reject(new Error('no answer')), this.#timeoutMs);
        }),
      ]);
      this.#counts = fleetCounts(members);
      this.#at = Date.now();
      return this.#counts;
    } finally {
      clearTimeout(timer);
    }
  }
}
