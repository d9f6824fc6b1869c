import { Writable } from 'node:stream';
import Fastify, { type FastifyBaseLogger } from 'fastify';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { deferredChildLogger } from '../../src/server/http/http_logger.js';
import { RequestLog } from '../../src/server/http/http_reply.js';

// The request logger is made only when used, and the access line skips redaction: both must
// still write what the request's own pino child would have, and the root must still redact.

function capture() {
  const lines: Record<string, unknown>[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk.toString('utf8').split('\n')) {
        if (line !== '') lines.push(JSON.parse(line) as Record<string, unknown>);
      }
      done();
    },
  });
  const logger = pino(
    { level: 'info', redact: { paths: ['*.token', 'email'], censor: '[redacted]' } },
    stream,
  );
  return { logger, lines };
}

function app(logger: pino.Logger, observed: string[]) {
  const fastify = Fastify({
    loggerInstance: logger as FastifyBaseLogger,
    childLoggerFactory: deferredChildLogger,
    logController: new RequestLog(logger, new WeakMap(), (route, status) =>
      observed.push(`${route} ${status}`),
    ),
  });
  fastify.get('/quiet', async () => ({ ok: true }));
  fastify.get('/talks', async (request) => {
    request.log.warn({ email: 'alice@example.com', nested: { token: 'vct_secret' } }, 'said');
    return { ok: true };
  });
  return fastify;
}

describe('request logging', () => {
  it('writes one access line per request, with the request id and the route pattern', async () => {
    const { logger, lines } = capture();
    const observed: string[] = [];
    const fastify = app(logger, observed);
    const res = await fastify.inject({ method: 'GET', url: '/quiet?token=vct_secret' });
    expect(res.statusCode).toBe(200);
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatchObject({
      msg: 'request completed',
      reqId: expect.any(String),
      method: 'GET',
      route: '/quiet',
      status: 200,
    });
    expect(JSON.stringify(lines)).not.toContain('vct_secret');
    expect(observed).toEqual(['/quiet 200']);
    await fastify.close();
  });

  it("a line a route writes goes through the request's child: its id, and redacted", async () => {
    const { logger, lines } = capture();
    const fastify = app(logger, []);
    await fastify.inject({ method: 'GET', url: '/talks' });
    const said = lines.find((line) => line['msg'] === 'said');
    const done = lines.find((line) => line['msg'] === 'request completed');
    expect(said).toMatchObject({ email: '[redacted]', nested: { token: '[redacted]' } });
    expect(said?.['reqId']).toBeDefined();
    expect(said?.['reqId']).toBe(done?.['reqId']);
    await fastify.close();
  });
});
