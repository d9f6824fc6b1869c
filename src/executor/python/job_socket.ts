import { createHash, randomBytes, timingSafeEqual } from 'node:crypto';
import { chmod } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import type { DatatableLease, DatatableQueryResult } from '../../connector/datatable_connector.js';
import {
  type DatatableRef,
  formatDatatableRef,
  parseDatatableRef,
} from '../../connector/datatable_ref.js';
import {
  coerceError,
  OutputTooLargeError,
  ProxyRefusedError,
  ViewerCacheError,
} from '../../errors.js';

/** One data-table request from a runnable that holds no connection: what travels, nothing more. */
export interface ProxiedQuery {
  /** The reference exactly as the TypeScript client would build it (`datatable://main?as=viewer`). */
  readonly reference: string;
  readonly sql: string;
  readonly params: readonly unknown[];
}

/**
 * What answers a job's proxied queries once its token was checked: the job's own leases, on the
 * connector the TypeScript runnables use (so the viewer is the job's recorded viewer, never
 * anything the request says). The agent workers' proxy core plugs in here for remote jobs.
 */
export interface JobQueryProxy {
  query(request: ProxiedQuery): Promise<DatatableQueryResult>;
}

/** The in-process proxy: one lease per distinct reference for the job, opened on first use. */
export function createLocalQueryProxy(
  connect: (ref: DatatableRef) => Promise<DatatableLease>,
): JobQueryProxy {
  const leases = new Map<string, Promise<DatatableLease>>();
  return {
    async query({ reference, sql, params }) {
      const ref = parseDatatableRef(reference);
      const key = formatDatatableRef(ref);
      let lease = leases.get(key);
      if (lease === undefined) {
        lease = connect(ref);
        leases.set(key, lease);
        // A refused connect is not remembered: the next request asks (and is refused) again.
        lease.catch(() => leases.delete(key));
      }
      return (await lease).query(sql, params);
    },
  };
}

/** A listening per-job socket: its path, the token it accepts, and how to end it. */
export interface JobSocket {
  readonly path: string;
  readonly token: string;
  /** Stops accepting the token and closes every connection; idempotent. */
  close(): Promise<void>;
}

/**
 * Serves `proxy` on a unix socket at `path` (inside a private 0700 directory; the socket itself
 * 0600) for as long as the job runs. Each line is one JSON request carrying the job's token;
 * anything without it, or after close(), is answered `E_PROXY_REFUSED` and nothing else.
 */
export async function openJobSocket(
  path: string,
  proxy: JobQueryProxy,
  limits: { maxResponseBytes: number },
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
      if (buffered.length > limits.maxResponseBytes) return socket.destroy();
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

  const answer = async (line: string): Promise<string> => {
    let request: {
      id?: unknown;
      token?: unknown;
      reference?: unknown;
      sql?: unknown;
      params?: unknown;
    };
    try {
      request = JSON.parse(line);
    } catch {
      return refusal(undefined, new ProxyRefusedError('a request is one JSON object per line'));
    }
    const id = typeof request.id === 'number' ? request.id : undefined;
    if (
      !open ||
      typeof request.token !== 'string' ||
      !timingSafeEqual(sha256(request.token), digest)
    )
      return refusal(id, new ProxyRefusedError());
    const { reference, sql, params } = request;
    if (typeof reference !== 'string' || typeof sql !== 'string' || !Array.isArray(params))
      return refusal(id, new ProxyRefusedError('a request carries reference, sql and params'));
    try {
      const result = await proxy.query({ reference, sql, params });
      if (!open) return refusal(id, new ProxyRefusedError());
      const text = JSON.stringify({ id, ok: true, rows: result.rows, rowCount: result.rowCount });
      if (text.length > limits.maxResponseBytes)
        return refusal(id, new OutputTooLargeError('the rows of one query exceed the proxy bound'));
      return text;
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
