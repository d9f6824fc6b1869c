import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import Fastify from 'fastify';
import { afterEach, describe, expect, it, vi } from 'vitest';
import type { JobResult } from '../../src/index.js';
import { requireCachingDecisions } from '../../src/server/http/http_caching.js';
import { sendResult } from '../../src/server/http/http_reply.js';

// A hit hands the stored bytes through: a small result is copied into one buffer written by one
// `end`, a large one is written in pieces, corked. Either way the answer is the envelope around
// the very bytes stored, with the route's caching headers, the request id and the length.

const apps: { close(): Promise<unknown> }[] = [];
afterEach(async () => {
  for (const app of apps.splice(0)) await app.close();
});

function stored(bytes: Buffer, fromCache: boolean): JobResult {
  return {
    jobId: 'ignored',
    fromCache,
    get value(): unknown {
      throw new Error('a hit must not parse its value');
    },
    json: () => bytes,
  };
}

async function serve(result: JobResult, jobId: string) {
  const app = Fastify({ genReqId: () => 'req-7' });
  requireCachingDecisions(app);
  app.addHook('onSend', (request, reply, payload, done) => {
    reply.header('x-request-id', request.id);
    done(null, payload);
  });
  app.post('/run', { config: { caching: 'per-caller' } }, async (_request, reply) => {
    sendResult(reply, jobId, result);
  });
  apps.push(app);
  const url = new URL(await app.listen({ host: '127.0.0.1', port: 0 }));
  // node:http, to see the headers exactly as sent (fetch would merge and normalise).
  return new Promise<{ raw: string[]; body: Buffer }>((resolve, reject) => {
    const req = httpRequest(
      { host: url.hostname, port: url.port, path: '/run', method: 'POST' },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ raw: res.rawHeaders, body: Buffer.concat(chunks) }));
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end();
  });
}

const headerPairs = (raw: string[]) => {
  const pairs: [string, string][] = [];
  for (let i = 0; i < raw.length; i += 2) pairs.push([raw[i]!.toLowerCase(), raw[i + 1]!]);
  return pairs.filter(([name]) => !['date', 'connection', 'keep-alive'].includes(name));
};

describe('sendResult', () => {
  for (const [what, size] of [
    ['a small result (one buffer)', 200],
    ['a result at the copy limit', 16 * 1024],
    ['a large result (written corked, not copied)', 200 * 1024],
  ] as const) {
    it(`${what}: the envelope around the stored bytes, with every header once`, async () => {
      // Multi-byte characters, so a byte length that counted characters would show.
      const text = JSON.stringify({ rows: 'é€😀'.repeat(size) }).slice(0, size);
      const bytes = Buffer.from(
        `"${Buffer.from(text)
          .toString('base64')
          .slice(0, size - 2)}"`,
      );
      const jobId = 'job-€-1';
      const { raw, body } = await serve(stored(bytes, true), jobId);
      const expected = Buffer.concat([
        Buffer.from(`{"jobId":${JSON.stringify(jobId)},"fromCache":true,"result":`),
        bytes,
        Buffer.from('}'),
      ]);
      expect(body.equals(expected)).toBe(true);
      expect(JSON.parse(body.toString('utf8'))).toEqual({
        jobId,
        fromCache: true,
        result: JSON.parse(bytes.toString('utf8')),
      });
      expect(headerPairs(raw)).toEqual([
        ['x-request-id', 'req-7'],
        ['cache-control', 'private, no-store'],
        ['vary', 'Authorization'],
        ['content-type', 'application/json; charset=utf-8'],
        ['content-length', String(expected.length)],
        ['x-viewer-cache', 'hit'],
      ]);
    });
  }

  it('a computed result says miss', async () => {
    const { raw, body } = await serve(stored(Buffer.from('[1,2]'), false), 'j');
    expect(JSON.parse(body.toString('utf8'))).toEqual({
      jobId: 'j',
      fromCache: false,
      result: [1, 2],
    });
    expect(headerPairs(raw)).toContainEqual(['x-viewer-cache', 'miss']);
  });
});

describe('results finished together are written together (after the poll)', () => {
  /** A server whose route answers once `release` is called, counting the requests it holds. */
  async function gated(size: number) {
    let held = 0;
    let release!: () => void;
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const allHeld = (n: number) => vi.waitFor(() => expect(held).toBe(n), { timeout: 5000 });
    const app = Fastify();
    requireCachingDecisions(app);
    app.post<{ Querystring: { n: string } }>(
      '/run',
      { config: { caching: 'per-caller' } },
      async (request, reply) => {
        held++;
        await gate;
        sendResult(
          reply,
          `job-${request.query.n}`,
          stored(Buffer.from(`"${'x'.repeat(size)}"`), true),
        );
      },
    );
    apps.push(app);
    const url = new URL(await app.listen({ host: '127.0.0.1', port: 0 }));
    const ask = (n: number) => {
      const req = httpRequest({
        host: url.hostname,
        port: url.port,
        path: `/run?n=${n}`,
        method: 'POST',
        agent: false,
      });
      const answer = new Promise<{ jobId: string; length: number }>((resolve, reject) => {
        req.on('response', (res) => {
          const chunks: Buffer[] = [];
          res.on('data', (c: Buffer) => chunks.push(c));
          res.on('end', () => {
            const body = JSON.parse(Buffer.concat(chunks).toString('utf8'));
            resolve({ jobId: body.jobId, length: body.result.length });
          });
          res.on('error', reject);
        });
        req.on('error', reject);
      });
      req.end();
      return { req, answer };
    };
    return { ask, allHeld, url, release: () => release() };
  }

  for (const size of [100, 64 * 1024]) {
    it(`${size} B: every connection gets its own whole answer, though one of them hung up`, async () => {
      const { ask, allHeld, release } = await gated(size);
      const asks = [0, 1, 2, 3, 4, 5].map(ask);
      await allHeld(6);
      // The client of request 2 is gone before its answer is written, in the same batch.
      const gone = asks[2]!;
      gone.answer.catch(() => {});
      const closed = new Promise((resolve) => gone.req.on('close', resolve));
      gone.req.destroy();
      await closed;
      release();
      const answers = await Promise.all(asks.filter((_, i) => i !== 2).map((a) => a.answer));
      expect(answers).toEqual([0, 1, 3, 4, 5].map((n) => ({ jobId: `job-${n}`, length: size })));
    });
  }

  it('pipelined requests on one connection are answered in order, each whole', async () => {
    const { url, release } = await gated(5000);
    release();
    const socket = connect(Number(url.port), url.hostname);
    socket.on('error', () => {});
    const asks = [1, 2, 3, 4]
      .map((n) => `POST /run?n=${n} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n`)
      .join('');
    const received: Buffer[] = [];
    const all = new Promise<string>((resolve) => {
      socket.on('data', (chunk: Buffer) => {
        received.push(chunk);
        const text = Buffer.concat(received).toString('utf8');
        // Each body ends with its result's last character and the envelope's close: `x"}`.
        if ((text.match(/x"\}/g) ?? []).length === 4) resolve(text);
      });
    });
    // One TCP write: the server parses all four in one read.
    socket.write(asks);
    const text = await all;
    socket.destroy();
    const bodies = text
      .split('HTTP/1.1 200 OK')
      .slice(1)
      .map((answer) => JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)));
    expect(bodies.map((b) => [b.jobId, b.result.length])).toEqual([
      ['job-1', 5000],
      ['job-2', 5000],
      ['job-3', 5000],
      ['job-4', 5000],
    ]);
  });

  it("a test's fake timers cannot hold answers back (setImmediate is taken at load)", async () => {
    const { ask, allHeld, release } = await gated(10);
    // The fake setImmediate never runs by itself: an answer written through it would never come.
    vi.useFakeTimers({ toFake: ['setImmediate'] });
    try {
      const one = ask(1);
      await allHeld(1);
      release();
      expect(await one.answer).toEqual({ jobId: 'job-1', length: 10 });
    } finally {
      vi.useRealTimers();
    }
  });
});
