import { randomBytes } from 'node:crypto';
import { afterEach, describe, expect, it } from 'vitest';
import { createTestDatabase, uniquePrefix } from '../../helpers/pg.js';
import { ServerFleet } from '../../helpers/server_fleet.js';
import { httpRequest } from '../../helpers/server_process.js';

// The access line (issue 23, Decision 3): one line per request, written asynchronously in
// batches, and none of them lost when the server is stopped; VIEWER_CACHE_ACCESS_LOG=off writes
// none while /metrics still counts every request.

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const step of cleanup.splice(0).reverse()) await step().catch(() => {});
});

async function server(env: Record<string, string>) {
  const prefix = uniquePrefix();
  const db = await createTestDatabase(prefix);
  cleanup.push(() => db.drop());
  const fleet = await ServerFleet.start({
    databaseUrl: db.url,
    prefix,
    secretKey: randomBytes(32).toString('hex'),
    count: 1,
    env: { LOG_LEVEL: 'info', ...env },
  });
  cleanup.push(() => fleet.stop());
  return { url: fleet.urls[0]!, process: fleet.servers[0]! };
}

const REQUESTS = 30;
const accessLines = (lines: readonly string[]) =>
  lines
    .filter((line) => line.startsWith('{'))
    .map((line) => JSON.parse(line) as Record<string, unknown>)
    .filter((line) => line['msg'] === 'request completed' && line['route'] === '/healthz');

describe('the access line', () => {
  it('SIGTERM right after the last request loses none of the buffered lines', async () => {
    const { url, process } = await server({});
    for (let i = 0; i < REQUESTS; i++)
      expect((await httpRequest(url, 'GET', '/healthz')).status).toBe(200);
    // At once: 30 short lines sit in the 4 KiB buffer, well inside the 250 ms flush period.
    process.signal('SIGTERM');
    const exit = await process.closed;
    expect(exit).toEqual({ code: 0, signal: null });
    const lines = accessLines(process.lines);
    expect(lines).toHaveLength(REQUESTS);
    expect(lines[0]).toMatchObject({ method: 'GET', status: 200 });
  }, 120_000);

  it('VIEWER_CACHE_ACCESS_LOG=off writes none, and /metrics still counts each request', async () => {
    const { url, process } = await server({ VIEWER_CACHE_ACCESS_LOG: 'off' });
    for (let i = 0; i < REQUESTS; i++) await httpRequest(url, 'GET', '/healthz');
    const metrics = await httpRequest(url, 'GET', '/metrics');
    const counted = /route="\/healthz",status="200"\} (\d+)/.exec(metrics.text);
    expect(Number(counted?.[1])).toBe(REQUESTS);
    process.signal('SIGTERM');
    await process.closed;
    expect(accessLines(process.lines)).toHaveLength(0);
  }, 120_000);
});
