import { createConnection, createServer, type Server, type Socket } from 'node:net';

/**
 * How the proxy treats traffic:
 * - `forward`: a transparent TCP proxy.
 * - `refuse`: not listening (like a stopped server: connection refused); live connections dropped.
 * - `blackhole`: connections stay open but no byte moves either way (like a partition). Bytes
 *   already sent wait in the socket buffers and are delivered, in order, once forwarding resumes,
 *   exactly as TCP would after a partition heals.
 */
export type ProxyMode = 'forward' | 'refuse' | 'blackhole';

interface Pair {
  client: Socket;
  upstream: Socket;
}

/** A TCP proxy in front of a real server, for making it stop, hang or drop clients on demand. */
export class TcpProxy {
  readonly #target: { host: string; port: number };
  readonly #pairs = new Set<Pair>();
  #server: Server | undefined;
  #mode: ProxyMode = 'forward';
  #port = 0;

  private constructor(target: { host: string; port: number }) {
    this.#target = target;
  }

  /** Starts a proxy on a free 127.0.0.1 port, forwarding to `target`. */
  static async start(target: { host: string; port: number }): Promise<TcpProxy> {
    const proxy = new TcpProxy(target);
    await proxy.#listen(0);
    return proxy;
  }

  get port(): number {
    return this.#port;
  }

  get mode(): ProxyMode {
    return this.#mode;
  }

  /** Connections currently open through the proxy. */
  get connections(): number {
    return this.#pairs.size;
  }

  async setMode(mode: ProxyMode): Promise<void> {
    if (mode === this.#mode) return;
    const previous = this.#mode;
    this.#mode = mode;
    if (mode === 'refuse') {
      this.dropConnections();
      await this.#close();
      return;
    }
    if (previous === 'refuse') await this.#listen(this.#port);
    for (const pair of this.#pairs) this.#apply(pair);
  }

  /** Cuts every live connection (both sides), as a server restart or a NAT timeout would. */
  dropConnections(): void {
    for (const pair of this.#pairs) {
      pair.client.destroy();
      pair.upstream.destroy();
    }
    this.#pairs.clear();
  }

  async stop(): Promise<void> {
    this.dropConnections();
    await this.#close();
  }

  #apply(pair: Pair): void {
    if (this.#mode === 'forward') {
      pair.client.resume();
      pair.upstream.resume();
    } else {
      pair.client.pause();
      pair.upstream.pause();
    }
  }

  #listen(port: number): Promise<void> {
    const server = createServer((client) => this.#accept(client));
    this.#server = server;
    return new Promise((resolve, reject) => {
      server.once('error', reject);
      server.listen(port, '127.0.0.1', () => {
        server.off('error', reject);
        const address = server.address();
        this.#port = typeof address === 'object' && address ? address.port : port;
        resolve();
      });
    });
  }

  #close(): Promise<void> {
    const server = this.#server;
    this.#server = undefined;
    if (server === undefined) return Promise.resolve();
    return new Promise((resolve) => server.close(() => resolve()));
  }

  #accept(client: Socket): void {
    if (this.#mode === 'refuse') {
      client.destroy();
      return;
    }
    const upstream = createConnection(this.#target);
    const pair = { client, upstream };
    this.#pairs.add(pair);
    const end = () => {
      if (!this.#pairs.delete(pair)) return;
      client.destroy();
      upstream.destroy();
    };
    client.on('error', end);
    upstream.on('error', end);
    client.on('close', end);
    upstream.on('close', end);
    // Plain data handlers rather than pipe(): pipe() resumes a source on 'drain' by itself, which
    // would leak bytes through a blackhole. Test traffic is small, so no backpressure handling.
    client.on('data', (chunk) => upstream.write(chunk));
    upstream.on('data', (chunk) => client.write(chunk));
    this.#apply(pair);
  }
}
