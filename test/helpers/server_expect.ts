import { expect } from 'vitest';
import type { Answer, RunAnswer } from './server_process.js';

/** What no client answer, log line or metric may hold. */
export interface Secrets {
  readonly secretKey: string;
  /** Every bearer token known to the test so far. */
  tokens(): readonly string[];
}

/** Nothing a client or a log reader must not see: tokens, emails, the secret key. */
export function expectNoSecrets(secrets: Secrets, text: string, what = 'text'): void {
  expect(text, what).not.toContain('@example.com');
  expect(text, what).not.toContain(secrets.secretKey);
  expect(text, what).not.toMatch(/vc[tj]_[A-Za-z0-9_-]{20,}/);
  for (const token of secrets.tokens())
    expect(text.includes(token), `${what} holds a token`).toBe(false);
}

/** A successful run: 200, and the cache header agrees with the body. */
export function expectOk(answer: RunAnswer, fromCache: boolean): void {
  expect(answer.status, answer.text).toBe(200);
  expect(answer.fromCache).toBe(fromCache);
  expect(answer.headers.get('x-viewer-cache')).toBe(fromCache ? 'hit' : 'miss');
  expect(answer.headers.get('content-type')).toMatch(/^application\/json/);
  expect(answer.json).toMatchObject({ jobId: expect.any(String) });
}

/** A clean refusal: the status, `{ error: { code, message } }` and nothing else worth stealing. */
export function expectRefused(
  secrets: Secrets,
  answer: Answer,
  status: number,
  code: string,
): void {
  expect(answer.status, answer.text).toBe(status);
  // A refused run also names its job (`jobId`), the id its failure line carries.
  const { jobId, ...rest } = answer.json as { jobId?: unknown };
  expect(rest).toEqual({ error: { code, message: expect.any(String) } });
  if (jobId !== undefined) expect(jobId).toMatch(/^[0-9a-f-]{36}$/);
  expect(answer.headers.get('x-viewer-cache')).toBeNull();
  expectNoSecrets(secrets, answer.text);
  // No stack trace, source location or internal detail.
  expect(answer.text).not.toMatch(/\bat \S+ \(|\.ts:\d+|node_modules|Error:/);
}
