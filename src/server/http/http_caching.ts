import type { FastifyInstance, FastifyRequest, onSendHookHandler, RouteOptions } from 'fastify';

/*
 * What a cache in front of the server (a CDN, a proxy, a browser) may keep of each answer. Every
 * route declares it (`config: { caching }`): registering a route without a decision throws, so
 * a route added later cannot ship without one, and test/integration/pg/server_cache_headers
 * .test.ts walks every declared route, its errors included.
 */

/**
 * - `per-caller`: the answer depends on who asks (their rows, their outbox, their token's
 *   workspace, even a refusal of them): `Cache-Control: private, no-store` and `Vary:
 *   Authorization` (the credential is a header — or, for embed links, also the URL, which every
 *   cache keys on anyway).
 * - `live`: the answer is nobody's in particular (health, metrics, a public app's anonymous run,
 *   cache counters) but is the state of now, never to be replayed: `Cache-Control: no-store`.
 */
export type RouteCaching = 'per-caller' | 'live';

declare module 'fastify' {
  interface FastifyContextConfig {
    /** Required on every route of the server: see {@link requireCachingDecisions}. */
    caching?: RouteCaching;
  }
}

/** The headers of each decision, and of answers that come from no route (404, malformed URL). */
export const CACHE_HEADERS: Readonly<Record<RouteCaching, Readonly<Record<string, string>>>> = {
  'per-caller': { 'cache-control': 'private, no-store', vary: 'Authorization' },
  live: { 'cache-control': 'no-store' },
};

export interface DeclaredRoute {
  readonly method: string;
  readonly url: string;
  readonly caching: RouteCaching;
}

const declared = new WeakMap<FastifyInstance, DeclaredRoute[]>();

/** Every route registered on `app` since {@link requireCachingDecisions}, with its decision. */
export function declaredRoutes(app: FastifyInstance): readonly DeclaredRoute[] {
  return declared.get(app) ?? [];
}

/** {@link CACHE_HEADERS} as `writeHead`'s flat list: `[name, value, name, value…]`. */
const HEADER_LISTS: Readonly<Record<RouteCaching, readonly string[]>> = {
  'per-caller': Object.entries(CACHE_HEADERS['per-caller']).flat(),
  live: Object.entries(CACHE_HEADERS.live).flat(),
};

/**
 * The caching headers of the route `request` matched, as a flat list, for a reply written by
 * hand (`sendResult`, which hijacks the reply: Fastify's onSend hooks do not run for it).
 * A request that matched no declared route gets `live`'s.
 */
export function cachingHeaderList(request: FastifyRequest): readonly string[] {
  const caching = (request.routeOptions.config as { caching?: RouteCaching } | undefined)?.caching;
  return HEADER_LISTS[caching ?? 'live'];
}

/**
 * Makes every route of `app` registered from now on declare its caching, and gives each answer
 * of it (success, refusal or error) the decision's headers: an `onSend` hook adds them to every
 * answer Fastify sends, and the one reply written by hand (`sendResult`) writes them itself
 * ({@link cachingHeaderList}). They used to be set on the raw response by an `onRequest` hook,
 * which cost every served hit a hook and two validated `setHeader`s (1.6 µs on the 2-core VM).
 */
export function requireCachingDecisions(app: FastifyInstance): void {
  const routes: DeclaredRoute[] = [];
  declared.set(app, routes);
  app.addHook('onRoute', (route: RouteOptions) => {
    const caching = (route.config as { caching?: unknown } | undefined)?.caching;
    const methods = Array.isArray(route.method) ? route.method : [route.method];
    if (caching !== 'per-caller' && caching !== 'live') {
      throw new Error(
        `route ${methods.join(',')} ${route.url} declares no caching (config.caching: 'per-caller' or 'live')`,
      );
    }
    for (const method of methods) routes.push({ method, url: route.url, caching });
    const existing = route.onSend;
    const own = setHeaders(CACHE_HEADERS[caching]);
    route.onSend =
      existing === undefined ? [own] : [own, ...(Array.isArray(existing) ? existing : [existing])];
  });
}

/** Sets `headers` on a response that came from no route (a 404, a refusal of the URL itself). */
export function setLiveHeaders(raw: { setHeader(name: string, value: string): unknown }): void {
  for (const [name, value] of Object.entries(CACHE_HEADERS.live)) raw.setHeader(name, value);
}

function setHeaders(headers: Readonly<Record<string, string>>): onSendHookHandler {
  const entries = Object.entries(headers);
  return (_request, reply, payload, done) => {
    for (const [name, value] of entries) reply.header(name, value);
    done(null, payload);
  };
}
