import process from 'node:process';

/**
 * pg's warning, once per process, when a query is sent on a client already executing one
 * ("Calling client.query() when the client is already executing a query is deprecated"): pg 9
 * makes it an error, and an overlapping query is a bug of ours (two flows sharing a connection).
 */
export const QUERY_OVERLAP = /already executing a query/;

/** Makes the warning fail this process's test run (test/setup_warnings.ts calls it). */
export function failOnQueryOverlap(): void {
  // Once per process: a setup file runs again for every file of a worker that is not isolated.
  const installed = Symbol.for('viewer-cache.test.query-overlap');
  const holder = globalThis as { [installed]?: true };
  if (holder[installed]) return;
  holder[installed] = true;
  process.on('warning', (warning) => {
    if (QUERY_OVERLAP.test(warning.message)) {
      throw new Error(`pg query overlap: ${warning.message}\n${warning.stack ?? ''}`);
    }
  });
}
