import { createHmac, randomBytes } from 'node:crypto';
import { type Logger, pino } from 'pino';

export type { Logger } from 'pino';

/** The default logger of every component: silent until the application injects its own. */
export const silentLogger: Logger = pino({ level: 'silent' });

// Keyed, so that a log reader cannot confirm a guessed email by hashing it. Per process unless
// the operator sets VIEWER_CACHE_LOG_SALT to correlate tags across processes.
const logSalt = process.env['VIEWER_CACHE_LOG_SALT'] || randomBytes(16).toString('hex');

/**
 * A short tag for an identity (email, token, key) that may appear in logs without disclosing it:
 * 12 hex digits of an HMAC-SHA-256. The same value gets the same tag within a process (or across
 * processes sharing VIEWER_CACHE_LOG_SALT). `null` stays `null`.
 */
export function redactIdentity(value: string | null): string | null {
  return value === null
    ? null
    : createHmac('sha256', logSalt).update(value).digest('hex').slice(0, 12);
}
