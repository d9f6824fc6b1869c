import Fastify, { type FastifyReply, type FastifyRequest } from 'fastify';
import type { Registry } from 'prom-client';
import {
  type CachedExecutor,
  type Datatables,
  type Executor,
  type Job,
  type Logger,
  type RunOrigin,
  ViewerCacheError,
} from '../index.js';
import type { DemoWorld } from './demo.js';
import type { Scheduler } from './scheduler.js';
import type { ApiTokens, JobTokens, TokenIdentity } from './tokens.js';

export interface HttpDeps {
  logger: Logger;
  executor: Executor;
  cache: CachedExecutor;
  datatables: Datatables;
  world: DemoWorld;
  apiTokens: ApiTokens;
  jobTokens: JobTokens;
  scheduler: Scheduler;
  metrics: {
    registry: Registry;
    observeRequest(route: string, status: number): void;
    observeJob(outcome: string): void;
  };
  /** Checks the cache store (Redis) answers; absent for the in-process store. */
  pingStore?: () => Promise<void>;
  /** Largest request body accepted. @default 65536 */
  bodyLimit?: number;
}

/** An error answer: a stable code and a message safe to show (never data, never identities). */
class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

const runBody = {
  type: 'object',
  required: ['path'],
  additionalProperties: false,
  properties: {
    path: { type: 'string', minLength: 1, maxLength: 256 },
    args: { type: 'object' },
  },
} as const;

interface RunBody {
  path: string;
  args?: Record<string, unknown>;
}

const CLOSE = Buffer.from('}');

/**
 * The reference HTTP API (Fastify). Every route builds a job whose viewer comes from how the
 * request was made — the token's user for an app or direct run, nobody for a public app or a
 * webhook, the parent's viewer for a job token — never from the body.
 */
export function buildHttpApp(deps: HttpDeps) {
  const { executor, cache, world, apiTokens, jobTokens, metrics } = deps;
  const app = Fastify({
    loggerInstance: deps.logger,
    bodyLimit: deps.bodyLimit ?? 64 * 1024,
    // Fastify's default strips unknown body fields; `additionalProperties: false` must refuse them.
    ajv: { customOptions: { removeAdditional: false } },
  });
  // Bodies are JSON only: without this, a text/plain body would reach the routes as a string.
  app.removeContentTypeParser('text/plain');

  app.addHook('onResponse', async (request, reply) => {
    metrics.observeRequest(request.routeOptions.url ?? 'unmatched', reply.statusCode);
  });

  app.setErrorHandler(
    (
      error: Error & { statusCode?: number; code?: string; validation?: unknown },
      request,
      reply,
    ) => {
      const { status, code, message } = toHttpError(error);
      if (status >= 500) {
        // A runnable's own error text can echo its args or rows: only the code and the kind of
        // failure at error level; the text itself at debug, for whoever turns that on.
        const cause = error.cause instanceof Error ? error.cause.name : undefined;
        request.log.error({ code, cause }, 'request failed');
        request.log.debug({ code, err: error.message }, 'request failure detail');
      }
      reply.status(status).send({ error: { code, message } });
    },
  );
  app.setNotFoundHandler((_request, reply) => {
    reply.status(404).send({ error: { code: 'E_NOT_FOUND', message: 'no such route' } });
  });

  const authenticate = async (
    request: FastifyRequest,
    workspace: string,
  ): Promise<TokenIdentity> => {
    const token = bearer(request);
    const identity = token === null ? null : await apiTokens.verify(token);
    if (identity === null)
      throw new HttpError(401, 'E_UNAUTHENTICATED', 'a valid bearer token is required');
    if (identity.workspace !== workspace) {
      throw new HttpError(403, 'E_FORBIDDEN', 'this token belongs to another workspace');
    }
    return identity;
  };

  const run = async (reply: FastifyReply, job: Job) => {
    try {
      const result = await cache.run(job);
      metrics.observeJob('ok');
      // The stored JSON bytes go out as they are: a hit is never parsed or re-serialised.
      const head = Buffer.from(
        `{"jobId":${JSON.stringify(job.id)},"fromCache":${result.fromCache},"result":`,
      );
      return reply
        .header('content-type', 'application/json; charset=utf-8')
        .header('x-viewer-cache', result.fromCache ? 'hit' : 'miss')
        .send(Buffer.concat([head, result.json(), CLOSE]));
    } catch (err) {
      metrics.observeJob(err instanceof ViewerCacheError ? err.code : 'E_INTERNAL');
      throw err;
    }
  };

  const createJob = (
    workspace: string,
    body: RunBody,
    runAs: string,
    origin: RunOrigin,
    cacheTtlS?: number,
  ) =>
    executor.createJob({
      workspace,
      path: body.path,
      args: body.args ?? {},
      runAs,
      origin,
      ...(cacheTtlS === undefined ? {} : { cacheTtlS }),
    });

  const appRunnable = (appName: string, path: string, mustBePublic: boolean) => {
    const definition = Object.hasOwn(world.apps, appName) ? world.apps[appName] : undefined;
    if (definition === undefined || (mustBePublic && !definition.public)) {
      throw new HttpError(404, 'E_UNKNOWN_APP', 'no such app');
    }
    if (!definition.runnables.includes(path)) {
      throw new HttpError(404, 'E_UNKNOWN_RUNNABLE', 'this app has no such runnable');
    }
    return definition;
  };

  type WorkspaceParams = { workspace: string };
  type AppParams = WorkspaceParams & { app: string };

  // App request by a signed-in user: runs as the publisher, for the user (the viewer).
  app.post<{ Params: AppParams; Body: RunBody }>(
    '/api/w/:workspace/apps/:app/run',
    { schema: { body: runBody } },
    async (request, reply) => {
      const { workspace, app: appName } = request.params;
      const identity = await authenticate(request, workspace);
      const definition = appRunnable(appName, request.body.path, false);
      const session = { email: identity.email };
      return run(
        reply,
        createJob(workspace, request.body, definition.publisher, { kind: 'app', session }),
      );
    },
  );

  // A public app's anonymous visitor: no session, so no viewer.
  app.post<{ Params: AppParams; Body: RunBody }>(
    '/api/w/:workspace/public/apps/:app/run',
    { schema: { body: runBody } },
    async (request, reply) => {
      const { workspace, app: appName } = request.params;
      const definition = appRunnable(appName, request.body.path, true);
      return run(
        reply,
        createJob(workspace, request.body, definition.publisher, { kind: 'app', session: null }),
      );
    },
  );

  // Direct run and preview by a signed-in caller: the caller is both runner and viewer.
  app.post<{ Params: WorkspaceParams; Body: RunBody }>(
    '/api/w/:workspace/jobs/run',
    { schema: { body: runBody } },
    async (request, reply) => {
      const { workspace } = request.params;
      const caller = { email: (await authenticate(request, workspace)).email };
      return run(reply, createJob(workspace, request.body, caller.email, { kind: 'run', caller }));
    },
  );
  app.post<{ Params: WorkspaceParams; Body: RunBody }>(
    '/api/w/:workspace/jobs/preview',
    { schema: { body: runBody } },
    async (request, reply) => {
      const { workspace } = request.params;
      const caller = { email: (await authenticate(request, workspace)).email };
      // Previews are never cached: they stand for a draft.
      return run(
        reply,
        createJob(workspace, request.body, caller.email, { kind: 'preview', caller }, 0),
      );
    },
  );

  // A child run with a job token: runs as the parent's runner, for the parent's viewer.
  app.post<{ Params: WorkspaceParams; Body: RunBody }>(
    '/api/w/:workspace/jobs/run_child',
    { schema: { body: runBody } },
    async (request, reply) => {
      const { workspace } = request.params;
      const token = bearer(request);
      const grant = token === null ? null : jobTokens.verify(token);
      if (grant === null)
        throw new HttpError(401, 'E_UNAUTHENTICATED', 'a live job token is required');
      if (grant.workspace !== workspace)
        throw new HttpError(403, 'E_FORBIDDEN', 'that job belongs to another workspace');
      const origin: RunOrigin = { kind: 'job-token', parent: { perms: grant.perms } };
      return run(reply, createJob(workspace, request.body, grant.perms.email, origin));
    },
  );

  // Webhook trigger: runs as the token's owner, with no viewer.
  app.post<{ Params: WorkspaceParams & { hook: string }; Body: Record<string, unknown> }>(
    '/api/w/:workspace/hooks/:hook',
    async (request, reply) => {
      const { workspace, hook } = request.params;
      const identity = await authenticate(request, workspace);
      const path = Object.hasOwn(world.hooks, hook) ? world.hooks[hook] : undefined;
      if (path === undefined) throw new HttpError(404, 'E_UNKNOWN_HOOK', 'no such webhook');
      const args = isPlainObject(request.body) ? request.body : {};
      return run(reply, createJob(workspace, { path, args }, identity.email, { kind: 'trigger' }));
    },
  );

  app.get<{ Params: WorkspaceParams }>('/api/w/:workspace/schedules', async (request) => {
    await authenticate(request, request.params.workspace);
    return { schedules: deps.scheduler.status() };
  });

  app.get('/api/cache/stats', async () => ({
    ...cache.stats,
    inFlight: cache.inFlight,
    catalogGeneration: deps.datatables.generation,
    catalogListener: deps.datatables.listenerUp,
  }));

  app.get('/healthz', async () => ({ ok: true }));
  app.get('/readyz', async (_request, reply) => {
    const checks: Record<string, string> = {};
    await deps.datatables.ping().then(
      () => (checks['postgres'] = 'ok'),
      () => (checks['postgres'] = 'down'),
    );
    if (deps.pingStore) {
      await deps.pingStore().then(
        () => (checks['redis'] = 'ok'),
        () => (checks['redis'] = 'down'),
      );
    }
    const ok = Object.values(checks).every((value) => value === 'ok');
    return reply.status(ok ? 200 : 503).send({ ok, checks });
  });

  app.get('/metrics', async (_request, reply) => {
    reply.header('content-type', metrics.registry.contentType);
    return metrics.registry.metrics();
  });

  return app;
}

function bearer(request: FastifyRequest): string | null {
  const header = request.headers.authorization;
  if (typeof header !== 'string' || !header.startsWith('Bearer ')) return null;
  return header.slice(7).trim() || null;
}

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}

function toHttpError(error: Error & { statusCode?: number; code?: string; validation?: unknown }): {
  status: number;
  code: string;
  message: string;
} {
  if (error instanceof HttpError)
    return { status: error.status, code: error.code, message: error.message };
  if (error instanceof ViewerCacheError) {
    // 5xx messages may carry a runnable's own error text (data): say only what kind of failure.
    const fallback =
      (error.constructor as { defaultMessage?: string }).defaultMessage ?? 'internal error';
    const safe = error.status < 500 ? error.message : fallback;
    return { status: error.status, code: error.code, message: safe };
  }
  if (error.validation !== undefined) {
    return { status: 400, code: 'E_BAD_REQUEST', message: `invalid request: ${error.message}` };
  }
  switch (error.code) {
    case 'FST_ERR_CTP_BODY_TOO_LARGE':
      return { status: 413, code: 'E_PAYLOAD_TOO_LARGE', message: 'request body too large' };
    case 'FST_ERR_CTP_INVALID_MEDIA_TYPE':
      return { status: 415, code: 'E_UNSUPPORTED_MEDIA_TYPE', message: 'send application/json' };
    case 'FST_ERR_CTP_EMPTY_JSON_BODY':
    case 'FST_ERR_CTP_INVALID_JSON_BODY':
      return { status: 400, code: 'E_BAD_REQUEST', message: 'malformed JSON body' };
  }
  if (error.statusCode !== undefined && error.statusCode >= 400 && error.statusCode < 500) {
    return { status: error.statusCode, code: 'E_BAD_REQUEST', message: 'bad request' };
  }
  return { status: 500, code: 'E_INTERNAL', message: 'internal error' };
}
