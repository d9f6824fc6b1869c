import { Socket } from 'node:net';

/**
 * The socket under every data-table login connection. pg corks the stream around the four or
 * five messages of an extended-protocol query (and the lease corks a viewer's binding together
 * with the run's first statement); Node then sends the corked chunks with `writev`, whose path
 * measured 30–40 µs more per query than one `write` of the same bytes on this machine class
 * (`bench/datatable_bench.ts`). The chunks are small protocol messages, so joining them costs
 * less than the vectored write saves.
 */
export class CoalescingSocket extends Socket {
  override _writev(
    chunks: Array<{ chunk: unknown; encoding: BufferEncoding }>,
    callback: (error?: Error | null) => void,
  ): void {
    const buffers = chunks.map(({ chunk, encoding }) =>
      typeof chunk === 'string' ? Buffer.from(chunk, encoding) : (chunk as Buffer),
    );
    this._write(Buffer.concat(buffers), 'buffer' as BufferEncoding, callback);
  }
}
