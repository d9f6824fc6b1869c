import type { Server } from 'node:http';
import type { Socket } from 'node:net';

export interface ConnectionLimits {
  /** Open connections, all clients together (Node refuses beyond it). */
  readonly maxConnections: number;
  /** Open connections from one remote address; more are closed on arrival. */
  readonly maxConnectionsPerClient: number;
}

/**
 * Caps how many connections the server holds, in total and per client address, so that one
 * client opening thousands of connections (slow or idle) cannot starve everyone else.
 */
export function limitConnections(server: Server, limits: ConnectionLimits): void {
  server.maxConnections = limits.maxConnections;
  const open = new Map<string, number>();
  server.on('connection', (socket: Socket) => {
    const address = socket.remoteAddress ?? 'unknown';
    const count = (open.get(address) ?? 0) + 1;
    if (count > limits.maxConnectionsPerClient) {
      socket.destroy();
      return;
    }
    open.set(address, count);
    socket.once('close', () => {
      const left = (open.get(address) ?? 1) - 1;
      if (left <= 0) open.delete(address);
      else open.set(address, left);
    });
  });
}
