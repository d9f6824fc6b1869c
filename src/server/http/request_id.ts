import { randomUUID } from 'node:crypto';

/** What a caller's `x-request-id` may be: 1–128 letters, digits and `._:-` (no spaces, no quotes). */
const REQUEST_ID_RE = /^[A-Za-z0-9._:-]{1,128}$/;

/**
 * The request's id: the caller's `x-request-id` when it is well-formed (so a proxy's id
 * follows the request into our access and failure lines), else a fresh UUID. A malformed or
 * over-long header is replaced, never echoed: it could forge log lines or carry data.
 */
export function requestIdOf(header: string | string[] | undefined): string {
  return typeof header === 'string' && REQUEST_ID_RE.test(header) ? header : randomUUID();
}
