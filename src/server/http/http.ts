// The route table (over 450 lines on purpose): kept in one file so that how each route records its viewer reads
// in one place; errors, schemas and the reply/log ends live beside it (http_*.ts).
import Fastify, { type FastifyBaseLogger, type FastifyReply, type FastifyRequest } from 'fastify';
import type { Registry } from 'prom-client';
import {
  type CachedExecutor,
  type Datatables,
  EmbedInvalidError,
  type EmbedVerifier,
  type Executor,
  type Job,
  type JobResult,
  type Logger,
  type RunOrigin,
  ViewerCacheError,
} from '../../index.js';
import type { Apps } from '../apps/apps.js';
import type { ScheduleStatus } from '../apps/scheduler.js';
import type { ApiTokens, JobTokenGrant, TokenIdentity } from '../credentials/tokens.js';
import type { AccessRecord } from '../process/access_record.js';
import { limitConnections } from './connection_limits.js';
import { type AgentRouteDeps, registerAgentRoutes } from './http_agents.js';
import { requireCachingDecisions, setLiveHeaders } from './http_caching.js';
import { answerClientError, HttpError, toHttpError } from './http_errors.js';
import { registerExplainRoute } from './http_explain.js';
import { deferredChildLogger } from './http_logger.js';
import { registerOperatorRoutes } from './http_operator.js';
import { type RecipientRouteDeps, registerRecipientRoutes } from './http_recipients.js';
import { RequestLog, sendResult } from './http_reply.js';
import { traceRequests } from './http_tracing.js';

/** How a run ended, as the run-latency histogram labels it. */
export type RunOutcome = 'hit' | 'miss' | 'refused' | 'failed';

import {
  ajvOptions,
  appParams,
  embedQuery,
  hookBody,
  hookParams,
  MAX_PARAM_LENGTH,
  type RunBody,
  runBody,
  workspaceParams,
} from './http_schemas.js';
import { requestIdOf } from './request_id.js';
import { logRunFailure, type RunContext } from './run_failure_log.js';

/** What a child run through the API needs of its parent's job token. */
/** A live job token's grant; `depth` when its job is a queued one (its children go deeper). */
type ChildRunGrant = Pick<JobTokenGrant, 'workspace' | 'perms'> & { readonly depth?: number };

export interface HttpDeps {
  logger: Logger;
  executor: Executor;
  cache: CachedExecutor;
  datatables: Datatables;
  /** The apps served, by name. */
  apps: Apps;
  /** Webhook name → runnable path. */
  hooks: Readonly<Record<string, string>>;
  /** What `GET /api/w/:workspace/schedules` reports. */
  schedules(): ScheduleStatus[];
  apiTokens: ApiTokens;
  /** Job tokens: this process's own, and (jobs on workers) the shared ones. */
  /** Who a job token speaks for (this process's tokens, or shared ones with the queue). */
  jobTokens: {
    verify(token: string): ChildRunGrant | null | Promise<ChildRunGrant | null>;
  };
  /** With jobs on workers: workers whose heartbeat is fresh, reported by `/readyz`. */
  liveWorkers?: () => Promise<number>;
  /** With the queue: live workers and agents per `workspace/group` queue (`/readyz`'s `queues`). */
  queueFleet?: () => Promise<Record<string, number>>;
  /**
   * With jobs on agents (`--execution agent`): the group whose agents take this server's misses;
   * `/readyz` is not ready while none of it is connected.
   */
  agentGroup?: string;
  /** Verifies per-viewer embed links; absent: the embed route refuses every link. */
  embedVerifier?: EmbedVerifier;
  /** Records each run (who was shown what, when); absent: nothing recorded. */
  accessRecord?: Pick<AccessRecord, 'record'>;
  metrics: {
    registry: Registry;
    observeRequest(route: string, status: number, seconds: number): void;
    /** A run ended: `code` is 'ok' or the error code; `outcome` a fixed vocabulary. */
    observeJob(code: string, outcome: RunOutcome, seconds: number): void;
  };
  /** Per-recipient runs and outboxes (http_recipients.ts); absent: those routes are 404. */
  recipients?: Pick<RecipientRouteDeps, 'perRecipient' | 'outbox'>;
  /** Agent workers' routes and query proxy (http_agents.ts); absent: those routes are 404. */
  agents?: AgentRouteDeps;
  /** The cache store's readiness, `ok` or its state (store_readiness.ts); absent in process. */
  storeState?: () => Promise<string>;
  /** One access line per completed request (`VIEWER_CACHE_ACCESS_LOG`). @default true */
  accessLog?: boolean;
  /**
   * The invalidation bus's state (two tiers only): `confirmed` (epochs in memory, no round
   * trip), or `unconfirmed` (reconnecting: every lookup reads the epochs from Redis).
   */
  busState?: () => 'confirmed' | 'unconfirmed';
  /** Largest request body accepted. @default 65536 */
  bodyLimit?: number;
  /** Longest a client may take to send a whole request (ms). @default 10000 */
  requestTimeoutMs?: number;
  /** @default 1000 */
  maxConnections?: number;
  /** @default 100 */
  maxConnectionsPerClient?: number;
}

/** Longer than the executor's longest run (60 s), so an idle socket is one nobody waits on. */
const IDLE_SOCKET_MS = 70_000;

/**
 * The reference HTTP API (Fastify). Every route builds a job whose viewer comes from how the
 * request was made — the token's user for an app or direct run, nobody for a public app or a
 * webhook, the parent's viewer for a job token — never from the body.
 */
export function buildHttpApp(deps: HttpDeps) {
  const { executor, cache, apps, hooks, apiTokens, jobTokens, metrics } = deps;
  const requestTimeout = deps.requestTimeoutMs ?? 10_000;
  /** The code of a refused request, for its log line (set only on the error path). */
  const refusals = new WeakMap<FastifyRequest, string>();
  /** The run a failed request started, for its failure line and the job id in its answer. */
  const failedRuns = new WeakMap<FastifyRequest, RunContext>();
  const app = Fastify({
    // Typed as Fastify's logger interface so that request loggers can be deferred children.
    loggerInstance: deps.logger as FastifyBaseLogger,
    childLoggerFactory: deferredChildLogger,
    logController: new RequestLog(
      deps.logger,
      refusals,
      metrics.observeRequest,
      deps.accessLog ?? true,
    ),
    bodyLimit: deps.bodyLimit ?? 64 * 1024,
    // Fastify 5 turns all of these off by default, and with them Node's own: a body that never
    // finishes would hold its connection forever.
    requestTimeout,
    connectionTimeout: IDLE_SOCKET_MS,
    http: {
      requestTimeout,
      headersTimeout: requestTimeout,
      // Node checks the two timeouts above only this often (30 s by default).
      connectionsCheckingInterval: Math.min(1000, Math.ceil(requestTimeout / 4)),
    },
    clientErrorHandler: answerClientError,
    // The caller's `x-request-id` when it is a sane one (bounded, no control or odd characters),
    // else one of ours; either way it is in the access line and returned (hook below).
    genReqId: (raw) => requestIdOf(raw.headers['x-request-id']),
    routerOptions: { maxParamLength: MAX_PARAM_LENGTH },
    ajv: { customOptions: ajvOptions },
    // Router-level refusals (an over-long segment's 414, a malformed URL) in the usual error
    // format, instead of Fastify's own body that echoes the path.
    frameworkErrors: (error, _request, reply) => {
      const { status, code, message } = toHttpError(error);
      setLiveHeaders((reply as FastifyReply).raw);
      void (reply as FastifyReply).status(status).send({ error: { code, message } });
    },
  });
  // Every route below says what a cache in front may keep of its answers (http_caching.ts).
  requireCachingDecisions(app);
  limitConnections(app.server, {
    maxConnections: deps.maxConnections ?? 1000,
    maxConnectionsPerClient: deps.maxConnectionsPerClient ?? 100,
  });
  // Bodies are JSON only: without this, a text/plain body would reach the routes as a string.
  app.removeContentTypeParser('text/plain');

  // Every answer Fastify sends carries the request's id (the hit, written by hand, writes it
  // itself: `sendResult`). An onSend hook, not onRequest: a hit runs no hook for it.
  app.addHook('onSend', (request, reply, payload, done) => {
    reply.header('x-request-id', request.id);
    done(null, payload);
  });

  app.setErrorHandler((error: Error, request, reply) => {
    const answer = toHttpError(error);
    const { status, code, message, sqlstate } = answer;
    refusals.set(request, code);
    const failedRun = failedRuns.get(request);
    const body = {
      ...(failedRun === undefined ? {} : { jobId: failedRun.job.id }),
      error: { code, message, ...(sqlstate === undefined ? {} : { sqlstate }) },
    };
    if (failedRun !== undefined) {
      logRunFailure(request.log, failedRun, error, answer);
      request.log.debug({ code, err: error.message }, 'request failure detail');
    } else if (status >= 500) {
      // A runnable's own error text can echo its args or rows: only the code and the kind of
      // failure at error level; the text itself at debug, for whoever turns that on.
      const cause = error.cause instanceof Error ? error.cause.name : undefined;
      request.log.error({ code, cause }, 'request failed');
      request.log.debug({ code, err: error.message }, 'request failure detail');
    }
    return reply.status(status).send(body);
  });
  app.setNotFoundHandler((_request, reply) => {
    setLiveHeaders(reply.raw);
    return reply.status(404).send({ error: { code: 'E_NOT_FOUND', message: 'no such route' } });
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

  // With an OpenTelemetry SDK registered, each request has a span and its run runs inside it.
  const within = traceRequests(app);

  // The access record needs each job's origin kind, which the job does not carry: kept here
  // beside the job (only when recording).
  const { accessRecord } = deps;
  const originKinds = accessRecord === undefined ? null : new WeakMap<Job, string>();
  const recordAccess = (
    reply: FastifyReply,
    job: Job,
    outcome: RunOutcome,
    code: string | null,
  ) => {
    const params = reply.request.params as { app?: unknown };
    accessRecord!.record({
      job,
      app: typeof params.app === 'string' ? params.app : null,
      origin: originKinds!.get(job) ?? 'unknown',
      outcome,
      code,
    });
  };

  const run = async (reply: FastifyReply, job: Job) => {
    const started = performance.now();
    let result: JobResult;
    try {
      result = await within(reply.request, () => cache.run(job));
    } catch (err) {
      const seconds = (performance.now() - started) / 1000;
      const code = err instanceof ViewerCacheError ? err.code : 'E_INTERNAL';
      const outcome = err instanceof ViewerCacheError && err.status < 500 ? 'refused' : 'failed';
      metrics.observeJob(code, outcome, seconds);
      if (accessRecord !== undefined) recordAccess(reply, job, outcome, code);
      const { app: appName } = reply.request.params as { app?: unknown };
      failedRuns.set(reply.request, typeof appName === 'string' ? { job, app: appName } : { job });
      throw err;
    }
    const outcome = result.fromCache ? 'hit' : 'miss';
    metrics.observeJob('ok', outcome, (performance.now() - started) / 1000);
    if (accessRecord !== undefined) recordAccess(reply, job, outcome, null);
    sendResult(reply, job.id, result);
  };

  /**
   * `credential` is the token the request was made with: a scoped token's runs hold at most
   * its user's roles ∩ its scope, whatever the route (app, direct run, preview, webhook).
   */
  const createJob = (
    workspace: string,
    body: RunBody,
    runAs: string,
    origin: RunOrigin,
    credential: TokenIdentity | null,
    cacheTtlS?: number,
  ) => {
    const job = executor.createJob({
      workspace,
      path: body.path,
      args: body.args ?? {},
      runAs,
      origin,
      ...(credential?.roleScope === undefined ? {} : { roleScope: credential.roleScope }),
      ...(cacheTtlS === undefined ? {} : { cacheTtlS }),
    });
    originKinds?.set(job, origin.kind);
    return job;
  };

  const appOf = (appName: string, mustBePublic: boolean) => {
    const definition = Object.hasOwn(apps, appName) ? apps[appName] : undefined;
    if (definition === undefined || (mustBePublic && !definition.public)) {
      throw new HttpError(404, 'E_UNKNOWN_APP', 'no such app');
    }
    return definition;
  };
  const appRunnable = (appName: string, path: string, mustBePublic: boolean) => {
    const definition = appOf(appName, mustBePublic);
    if (!definition.runnables.includes(path)) {
      throw new HttpError(404, 'E_UNKNOWN_RUNNABLE', 'this app has no such runnable');
    }
    return definition;
  };

  type WorkspaceParams = { workspace: string };
  type AppParams = WorkspaceParams & { app: string };
  const runSchema = { params: workspaceParams, body: runBody };
  /** Answers that depend on who asks (their rows, their token): no shared cache may keep them. */
  const perCaller = { caching: 'per-caller' } as const;
  /** Nobody's answers, but the state of now: never replayed either. */
  const live = { caching: 'live' } as const;

  // App request by a signed-in user: runs as the publisher, for the user (the viewer).
  app.post<{ Params: AppParams; Body: RunBody }>(
    '/api/w/:workspace/apps/:app/run',
    { schema: { params: appParams, body: runBody }, config: perCaller },
    async (request, reply) => {
      const { workspace, app: appName } = request.params;
      const identity = await authenticate(request, workspace);
      const definition = appRunnable(appName, request.body.path, false);
      const session = { email: identity.email };
      await run(
        reply,
        createJob(
          workspace,
          request.body,
          definition.publisher,
          { kind: 'app', session },
          identity,
        ),
      );
    },
  );

  // A public app's anonymous visitor: no session, so no viewer.
  app.post<{ Params: AppParams; Body: RunBody }>(
    '/api/w/:workspace/public/apps/:app/run',
    { schema: { params: appParams, body: runBody }, config: live },
    async (request, reply) => {
      const { workspace, app: appName } = request.params;
      const definition = appRunnable(appName, request.body.path, true);
      await run(
        reply,
        createJob(
          workspace,
          request.body,
          definition.publisher,
          { kind: 'app', session: null },
          null,
        ),
      );
    },
  );

  // A per-viewer embed link: runs as the publisher, for the embed viewer the host signed — its
  // verified attributes and email, never the token. The token comes in `Authorization: Bearer`
  // or `?token=` (a link); neither is ever logged (the log line names the route, not the URL).
  app.post<{ Params: AppParams; Body: RunBody; Querystring: { token?: string } }>(
    '/api/w/:workspace/embed/apps/:app/run',
    { schema: { params: appParams, body: runBody, querystring: embedQuery }, config: perCaller },
    async (request, reply) => {
      const { workspace, app: appName } = request.params;
      const token = bearer(request) ?? request.query.token ?? null;
      if (token === null) throw new EmbedInvalidError('an embed link needs its token');
      if (deps.embedVerifier === undefined) {
        throw new EmbedInvalidError('this server does not accept embed links');
      }
      const viewer = await deps.embedVerifier.verify(token, { workspace, app: appName });
      const definition = appRunnable(appName, request.body.path, false);
      await run(
        reply,
        createJob(workspace, request.body, definition.publisher, { kind: 'embed', viewer }, null),
      );
    },
  );

  // Direct run and preview by a signed-in caller: the caller is both runner and viewer.
  app.post<{ Params: WorkspaceParams; Body: RunBody }>(
    '/api/w/:workspace/jobs/run',
    { schema: runSchema, config: perCaller },
    async (request, reply) => {
      const { workspace } = request.params;
      const identity = await authenticate(request, workspace);
      const caller = { email: identity.email };
      await run(
        reply,
        createJob(workspace, request.body, caller.email, { kind: 'run', caller }, identity),
      );
    },
  );
  app.post<{ Params: WorkspaceParams; Body: RunBody }>(
    '/api/w/:workspace/jobs/preview',
    { schema: runSchema, config: perCaller },
    async (request, reply) => {
      const { workspace } = request.params;
      const identity = await authenticate(request, workspace);
      const caller = { email: identity.email };
      // Previews are never cached: they stand for a draft.
      await run(
        reply,
        createJob(workspace, request.body, caller.email, { kind: 'preview', caller }, identity, 0),
      );
    },
  );

  // A child run with a job token: runs as the parent's runner, for the parent's viewer, within the
  // parent's role scope (the executor narrows a job-token origin by its parent's perms).
  app.post<{ Params: WorkspaceParams; Body: RunBody }>(
    '/api/w/:workspace/jobs/run_child',
    { schema: runSchema, config: perCaller },
    async (request, reply) => {
      const { workspace } = request.params;
      const token = bearer(request);
      const grant = token === null ? null : await jobTokens.verify(token);
      if (grant === null)
        throw new HttpError(401, 'E_UNAUTHENTICATED', 'a live job token is required');
      if (grant.workspace !== workspace)
        throw new HttpError(403, 'E_FORBIDDEN', 'that job belongs to another workspace');
      // The parent's depth (a queued job's, from its sealed grant): its child goes one deeper.
      const parent =
        grant.depth === undefined
          ? { perms: grant.perms }
          : { perms: grant.perms, depth: grant.depth };
      const origin: RunOrigin = { kind: 'job-token', parent };
      await run(reply, createJob(workspace, request.body, grant.perms.email, origin, null));
    },
  );

  // Webhook trigger: runs as the token's owner, with no viewer.
  app.post<{ Params: WorkspaceParams & { hook: string }; Body: Record<string, unknown> }>(
    '/api/w/:workspace/hooks/:hook',
    { schema: { params: hookParams, body: hookBody }, config: perCaller },
    async (request, reply) => {
      const { workspace, hook } = request.params;
      const identity = await authenticate(request, workspace);
      const path = Object.hasOwn(hooks, hook) ? hooks[hook] : undefined;
      if (path === undefined) throw new HttpError(404, 'E_UNKNOWN_HOOK', 'no such webhook');
      const body = { path, args: request.body };
      await run(reply, createJob(workspace, body, identity.email, { kind: 'trigger' }, identity));
    },
  );

  if (deps.recipients !== undefined) {
    registerRecipientRoutes(app, {
      ...deps.recipients,
      authenticate,
      appPublisher: (appName) => appOf(appName, false).publisher,
      appRunnable: (appName, path) => appRunnable(appName, path, false),
      isWorkspaceAdmin: async (workspace, email) =>
        (await deps.datatables.principals(workspace, email)).isAdmin,
    });
  }

  if (deps.agents !== undefined) registerAgentRoutes(app, deps.agents);
  registerExplainRoute(app, {
    ...deps,
    authenticate,
    isWorkspaceAdmin: async (workspace, email) =>
      (await deps.datatables.principals(workspace, email)).isAdmin,
  });

  app.get<{ Params: WorkspaceParams }>(
    '/api/w/:workspace/schedules',
    { schema: { params: workspaceParams }, config: perCaller },
    async (request) => {
      await authenticate(request, request.params.workspace);
      return { schedules: deps.schedules() };
    },
  );

  // What an operator asks of the process: counters, liveness, readiness, metrics.
  registerOperatorRoutes(app, deps);

  return app;
}

function bearer(request: FastifyRequest): string | null {
  const header = request.headers.authorization;
  if (typeof header !== 'string' || !header.startsWith('Bearer ')) return null;
  return header.slice(7).trim() || null;
}
