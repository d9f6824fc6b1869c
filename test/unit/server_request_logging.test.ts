import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import Fastify, {
  type FastifyBaseLogger,
  type FastifyInstance,
  type FastifyReply,
  type FastifyRequest,
} from 'fastify';
import { pino } from 'pino';
import { describe, expect, it } from 'vitest';
import { deferredChildLogger } from '../../src/server/http/http_logger.js';
import { RequestLog } from '../../src/server/http/http_reply.js';
import { createServerLogger } from '../../src/server/process/server_logger.js';

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

// The server's own logger (createServerLogger) gets the access line built by hand in pino's
// shape rather than serialised by pino: it must be the very line pino writes, honour the level,
// and carry a refusal's code — and nothing else (SPEC 24: no viewer, email, args, key, token).
describe("the access line of the server's own logger", () => {
  async function serverLogged(level: string, run: (fastify: FastifyInstance) => Promise<void>) {
    const dir = mkdtempSync(join(tmpdir(), 'vc-access-'));
    const file = join(dir, 'log.jsonl');
    const logger = createServerLogger({ logLevel: level, prettyLogs: false }, file);
    const refusals = new WeakMap<FastifyRequest, string>();
    const fastify = Fastify({
      loggerInstance: logger as FastifyBaseLogger,
      childLoggerFactory: deferredChildLogger,
      logController: new RequestLog(logger, refusals, () => {}),
    });
    fastify.post('/api/w/:workspace/apps/:app/run', async (request, reply) => {
      refusals.set(request, 'E_FORBIDDEN');
      return reply.status(403).send({ error: { code: 'E_FORBIDDEN' } });
    });
    fastify.get('/quiet', async () => ({ ok: true }));
    await run(fastify);
    await fastify.close();
    // What pino itself writes for the same fields, through the same logger and stream.
    const lines = () =>
      readFileSync(file, 'utf8')
        .split('\n')
        .filter((line) => line !== '');
    const hand = await new Promise<string[]>((resolve, reject) =>
      logger.flush((err) => (err ? reject(err) : resolve(lines()))),
    );
    for (const line of hand) {
      const fields = JSON.parse(line) as Record<string, unknown>;
      const { level: _level, time: _time, pid: _pid, hostname: _host, msg, ...own } = fields;
      logger.child({}, { redact: [] }).info(own, msg as string);
    }
    const both = await new Promise<string[]>((resolve, reject) =>
      logger.flush((err) => (err ? reject(err) : resolve(lines()))),
    );
    rmSync(dir, { recursive: true, force: true });
    const pinos = both.slice(hand.length);
    const untimed = (line: string) => line.replace(/"time":\d+/, '"time":0');
    return { hand: hand.map(untimed), pino: pinos.map(untimed) };
  }

  it('is the line pino writes for the same fields, refusal code included', async () => {
    const { hand, pino: expected } = await serverLogged('info', async (fastify) => {
      await fastify.inject({ method: 'GET', url: '/quiet?token=vct_secret' });
      await fastify.inject({
        method: 'POST',
        url: '/api/w/demo/apps/orders/run',
        headers: { authorization: 'Bearer vct_secret' },
        payload: { path: 'f/orders/list', args: { email: 'alice@example.com' } },
      });
    });
    expect(hand).toHaveLength(2);
    expect(hand).toEqual(expected);
    const [quiet, refused] = hand.map((line) => JSON.parse(line) as Record<string, unknown>);
    expect(quiet).toMatchObject({ level: 30, route: '/quiet', status: 200, method: 'GET' });
    expect(quiet).not.toHaveProperty('code');
    expect(refused).toMatchObject({
      route: '/api/w/:workspace/apps/:app/run',
      status: 403,
      code: 'E_FORBIDDEN',
      msg: 'request completed',
    });
    expect(Object.keys(refused!).sort()).toEqual(
      [
        'code',
        'hostname',
        'level',
        'method',
        'ms',
        'msg',
        'pid',
        'reqId',
        'route',
        'status',
        'time',
      ].sort(),
    );
    expect(hand.join('\n')).not.toMatch(/vct_secret|alice|orders\/list|demo/);
  });

  it('hands the lines of requests finishing together to the stream as one write', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'vc-access-'));
    const logger = createServerLogger({ logLevel: 'info', prettyLogs: false }, join(dir, 'l'));
    // pino's own stream (sonic-boom), its writes counted as they pass.
    const stream = (logger as unknown as Record<symbol, { write(text: string): boolean }>)[
      pino.symbols.streamSym
    ]!;
    const writes: string[] = [];
    const write = stream.write.bind(stream);
    stream.write = (text: string) => {
      writes.push(text);
      return write(text);
    };
    const log = new RequestLog(logger, new WeakMap(), () => {});
    const complete = (id: string) =>
      log.requestCompleted(
        null,
        { id, method: 'GET', routeOptions: { url: '/quiet' } } as unknown as FastifyRequest,
        { statusCode: 200, elapsedTime: 1 } as FastifyReply,
      );
    for (const id of ['a', 'b', 'c', 'd', 'e']) complete(id);
    expect(writes).toEqual([]);
    await new Promise((resolve) => process.nextTick(resolve));
    expect(writes).toHaveLength(1);
    expect(
      writes[0]!
        .split('\n')
        .filter(Boolean)
        .map((line) => JSON.parse(line).reqId),
    ).toEqual(['a', 'b', 'c', 'd', 'e']);
    // A later request's line is a write of its own.
    complete('f');
    await new Promise((resolve) => process.nextTick(resolve));
    expect(writes).toHaveLength(2);
    await new Promise<void>((resolve, reject) =>
      logger.flush((err) => (err ? reject(err) : resolve())),
    );
    rmSync(dir, { recursive: true, force: true });
  });

  it('is not written below the logger’s level', async () => {
    const { hand } = await serverLogged('warn', async (fastify) => {
      await fastify.inject({ method: 'GET', url: '/quiet' });
    });
    expect(hand).toHaveLength(0);
  });
});
