import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { chmod } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import type { DatatableConnector } from '../../connector/datatable_connector.js';
import {
  coerceError,
  JobTokenInvalidError,
  StatementRefusedError,
  ViewerCacheError,
} from '../../errors.js';
import type { Job } from '../../job.js';
import { type RawQueryProxyLimits, runProxiedQuery } from '../../proxy/query_proxy.js';

/** A listening per-job socket: its path, the token it accepts, and how to end it. */
export interface JobSocket {
  readonly path: string;
  readonly token: string;
  /** Stops accepting the token and closes every connection; idempotent. */
  close(): Promise<void>;
}

/** Longest request line read from the process (SQL and params), in UTF-16 units. */
const MAX_REQUEST = 1 << 20;

/**
 * Serves the query proxy (`runProxiedQuery`, the agent workers' core) for `job` on a unix
 * socket at `path` (inside a private 0700 directory; the socket itself 0600) for as long as
 * the job runs. Each line is one JSON request in the agent protocol: its version, the job's
 * token, the reference as `{ datatable, role }` (the viewer as `DATATABLE_VIEWER_ROLE`), one
 * statement and its params. The token stands for `job` only until close(); anything else is
 * `E_JOB_TOKEN_INVALID`. Each statement leases the viewer's connection and releases it (reset).
 */
export async function openJobSocket(
  path: string,
  job: Job,
  connector: DatatableConnector,
  limits: RawQueryProxyLimits | undefined,
): Promise<JobSocket> {
  const token = randomBytes(32).toString('base64url');
  const digest = sha256(token);
  let open = true;
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket) => {
    if (!open) return socket.destroy();
    sockets.add(socket);
    socket.on('error', () => {}); // the Python side dying mid-write is not our failure
    socket.on('close', () => sockets.delete(socket));
    serve(socket);
  });
  server.on('error', () => {});

  const serve = (socket: Socket) => {
    let buffered = '';
    let chain = Promise.resolve();
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => {
      buffered += chunk;
      if (buffered.length > MAX_REQUEST) return socket.destroy();
      let newline = buffered.indexOf('\n');
      while (newline !== -1) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        // One request at a time per connection, answered in order.
        chain = chain.then(() => answer(line).then((text) => void socket.write(`${text}\n`)));
        newline = buffered.indexOf('\n');
      }
    });
  };

  // The job while this socket is open; null for any other token, and for every token after.
  const jobs = {
    jobOfToken: (candidate: string) =>
      open && timingSafeEqual(sha256(candidate), digest) ? job : null,
  };
  const answer = async (line: string): Promise<string> => {
    let request: Record<string, unknown>;
    try {
      request = JSON.parse(line);
      if (request === null || typeof request !== 'object') throw new TypeError();
    } catch {
      return refusal(undefined, new StatementRefusedError('a request is one JSON object per line'));
    }
    const id = typeof request['id'] === 'number' ? request['id'] : undefined;
    try {
      // A copy bound is the DuckDB copy's, through the agent's hop; a Python statement has the
      // per-statement limits.
      const { copy: _copy, ...statement } = request;
      const result = await runProxiedQuery(
        statement as unknown as Parameters<typeof runProxiedQuery>[0],
        { jobs, connector, ...(limits === undefined ? {} : { limits }) },
      );
      // The job may have ended while the statement ran: its answer is not handed over.
      if (!open) return refusal(id, new JobTokenInvalidError());
      return `{"id":${id ?? 'null'},"ok":true,${result.json.slice(1)}`;
    } catch (thrown) {
      return refusal(id, coerceError(thrown));
    }
  };

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => resolve());
  });
  await chmod(path, 0o600);
  return {
    path,
    token,
    async close() {
      if (!open) return;
      open = false;
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/** A refusal as the client reads it: our code, or Postgres's SQLSTATE for a failed statement. */
function refusal(id: number | undefined, err: Error): string {
  if (err instanceof ViewerCacheError)
    return JSON.stringify({ id, ok: false, code: err.code, message: err.message });
  const sqlstate = (err as { code?: unknown }).code;
  return JSON.stringify({
    id,
    ok: false,
    code: 'E_QUERY_FAILED',
    sqlstate: typeof sqlstate === 'string' ? sqlstate : null,
    message: err.message,
  });
}

function sha256(text: string): Buffer {
  return createHash('sha256').update(text).digest();
}
