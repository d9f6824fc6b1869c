const UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000, d: 86_400_000 };
const DURATION_RE = /^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$/;

/** A duration in milliseconds, or a string such as `'250ms'`, `'30s'`, `'5m'`, `'1h'`. */
export type Duration = number | string;

/**
 * Milliseconds for a {@link Duration}. Throws a `TypeError` naming `option` when the value is not a
 * finite, non-negative number or a recognised string.
 */
export function resolveDuration(value: Duration, option: string): number {
  if (typeof value === 'number') {
    if (Number.isFinite(value) && value >= 0) return value;
  } else if (typeof value === 'string') {
    const match = DURATION_RE.exec(value.trim());
    if (match) return Number(match[1]) * UNITS[match[2]!]!;
  }
  throw new TypeError(
    `${option} must be a non-negative number of milliseconds or a string like '30s' (got ${JSON.stringify(value)})`,
  );
}

/** A size in bytes, or a string such as `'64kb'`, `'100mb'`. */
export type ByteSize = number | string;
const SIZE_UNITS: Record<string, number> = { b: 1, kb: 1024, mb: 1024 ** 2, gb: 1024 ** 3 };
const SIZE_RE = /^(\d+(?:\.\d+)?)\s*(b|kb|mb|gb)$/i;

/** Bytes for a {@link ByteSize}; throws a `TypeError` naming `option` when malformed or < 1. */
export function resolveByteSize(value: ByteSize, option: string): number {
  let bytes = Number.NaN;
  if (typeof value === 'number') bytes = value;
  else if (typeof value === 'string') {
    const match = SIZE_RE.exec(value.trim());
    if (match) bytes = Number(match[1]) * SIZE_UNITS[match[2]!.toLowerCase()]!;
  }
  if (Number.isFinite(bytes) && bytes >= 1) return Math.floor(bytes);
  throw new TypeError(
    `${option} must be a positive number of bytes or a string like '64mb' (got ${JSON.stringify(value)})`,
  );
}
