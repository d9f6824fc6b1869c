import { SpanKind } from '@opentelemetry/api';
import type {
  FastifyBaseLogger,
  FastifyInstance,
  FastifyRequest,
  RawReplyDefaultExpression,
  RawRequestDefaultExpression,
  RawServerDefault,
} from 'fastify';
import {
  AGENT_PROTOCOL_VERSION,
  AgentProtocolError,
  type CopyBound,
  type DatatableConnector,
  endedItsTransaction,
  type Job,
  type ProxiedReference,
  ProxyTransactions,
  type RawProxyTransactionLimits,
  type RawQueryProxyLimits,
  runProxiedRoleCheck,
  runTraced,
  ViewerCacheError,
} from '../../index.js';
import type { AgentDispatch } from '../agents/agent_dispatch.js';
import {
  AGENT_PROTOCOL_HEADER,
  AGENT_RESULT_LIMIT_BYTES,
  type AgentOutcome,
  JOB_TOKEN_HEADER,
  MAX_TAKE_WAIT_MS,
} from '../agents/agent_protocol.js';
import type { AgentIdentity, AgentTokens } from '../credentials/agent_tokens.js';
import { HttpError } from './http_errors.js';

/** The `traceparent` an agent sent (checked by the span's start), or null. */
function traceOf(request: FastifyRequest): string | null {
  const value = request.headers['traceparent'];
  return typeof value === 'string' ? value : null;
}

export interface AgentRouteDeps {
  readonly agentTokens: AgentTokens;
  readonly dispatch: AgentDispatch;
  /** Where proxied statements get their connections (the server's data tables). */
  readonly datatables: DatatableConnector;
  readonly proxyLimits?: RawQueryProxyLimits;
  /** Bounds of the proxy's transactions (docs/agents.md, "Transactions"). */
  readonly transactionLimits?: RawProxyTransactionLimits;
  /**
   * Subscribes to the end of every job an agent held (finished, timed out, lost, the server
   * stopping): its transactions are rolled back then. Without it they end at their own bounds.
   */
  readonly onJobEnded?: (listener: (job: Job) => void) => void;
  /**
   * Largest finish request (a job's result), bytes. Agents are checked before their body is
   * read, so only an agent holding a valid token can send this much. @default 16 MiB
   */
  readonly resultLimitBytes?: number;
}

const takeBody = {
  type: 'object',
  additionalProperties: false,
  properties: { waitMs: { type: 'integer', minimum: 0, maximum: MAX_TAKE_WAIT_MS } },
} as const;
const finishParams = {
  type: 'object',
  required: ['id'],
  additionalProperties: false,
  properties: { id: { type: 'string', minLength: 1, maxLength: 128 } },
} as const;
const finishBody = {
  type: 'object',
  required: ['ok'],
  additionalProperties: false,
  properties: {
    ok: { type: 'boolean' },
    value: {},
    code: { type: 'string', minLength: 1, maxLength: 64 },
    message: { type: 'string', maxLength: 2000 },
    sqlstate: { type: 'string', pattern: '^[0-9A-Z]{5}$' },
  },
} as const;
const queryBody = {
  type: 'object',
  required: ['reference', 'sql'],
  additionalProperties: false,
  properties: {
    reference: {
      type: 'object',
      required: ['datatable', 'role'],
      additionalProperties: false,
      properties: {
        datatable: { type: 'string', minLength: 1, maxLength: 63 },
        role: { type: ['string', 'null'], maxLength: 1024 },
      },
    },
    sql: { type: 'string', maxLength: 1 << 20 },
    params: { type: 'array', maxItems: 10_000 },
    // The transaction the statement belongs to (`null`: none open), from an agent that keeps
    // them; absent from one that does not (BEGIN is then refused as before).
    transaction: { type: ['string', 'null'], maxLength: 100 },
    // A DuckDB copy's bound (runProxiedQuery caps it at the proxy's copy maximum).
    copy: {
      type: 'object',
      required: ['maxRows', 'maxBytes'],
      additionalProperties: false,
      properties: {
        maxRows: { type: 'integer', minimum: 0 },
        maxBytes: { type: 'integer', minimum: 0 },
      },
    },
  },
} as const;

const holdsBody = {
  type: 'object',
  required: ['datatable', 'role'],
  additionalProperties: false,
  properties: {
    datatable: { type: 'string', minLength: 1, maxLength: 63 },
    role: { type: 'string', minLength: 1, maxLength: 63 },
  },
} as const;

/**
 * The agent workers' API: take a job, finish it, and the query proxy. Every request carries
 * the agent protocol version (an agent without it is refused with 426 E_AGENT_PROTOCOL before
 * anything else is read) and an agent token (`Authorization: Bearer vca_…`), which names a
 * worker group of one workspace. A query also carries the job's token, which only the agent
 * holding that running job can use.
 *
 * - `POST /api/agent/jobs/take` `{ waitMs? }` — long-poll: 200 `{ job, jobToken }`, or 204.
 * - `POST /api/agent/jobs/:id/beat` — the agent still works on it (every `beatMs` the take
 *   answered with, when it did: a queued job's lock is renewed by beats).
 * - `POST /api/agent/jobs/:id/finish` `{ ok: true, value }` | `{ ok: false, code, message }`.
 * - `POST /api/agent/query` `{ reference: { datatable, role }, sql, params?, transaction? }` —
 *   rows, as the job's recorded viewer (see runProxiedQuery); with `transaction` (an id, or null
 *   for none open) a BEGIN opens a transaction and answers its id (see ProxyTransactions).
 * - `POST /api/agent/holds` `{ datatable, role }` — `{ holds }`: `ctx.hasRole` for the job.
 */
export function registerAgentRoutes(
  app: FastifyInstance<
    RawServerDefault,
    RawRequestDefaultExpression,
    RawReplyDefaultExpression,
    FastifyBaseLogger
  >,
  deps: AgentRouteDeps,
): void {
  const { agentTokens, dispatch } = deps;
  const config = { caching: 'per-caller' } as const;
  const agents = new WeakMap<FastifyRequest, AgentIdentity>();

  // Before the body is read: an old agent is told to upgrade whatever it sent, and nobody without
  // a valid agent token gets a large body read (the finish route takes a job's whole result).
  const onRequest = async (request: FastifyRequest) => {
    if (request.headers[AGENT_PROTOCOL_HEADER] !== String(AGENT_PROTOCOL_VERSION)) {
      throw new AgentProtocolError();
    }
    const header = request.headers.authorization;
    const token =
      typeof header === 'string' && header.startsWith('Bearer ') ? header.slice(7).trim() : '';
    const agent = token === '' ? null : await agentTokens.verify(token);
    if (agent === null) {
      throw new HttpError(401, 'E_UNAUTHENTICATED', 'a valid agent token is required');
    }
    agents.set(request, agent);
  };
  const agentOf = (request: FastifyRequest) => agents.get(request)!;
  // The job a request's job token stands for, when this agent holds it; else null.
  const jobOfRequest = (request: FastifyRequest, agent: AgentIdentity) => {
    const jobToken = request.headers[JOB_TOKEN_HEADER];
    return typeof jobToken === 'string' && jobToken !== ''
      ? dispatch.jobOfToken(agent, jobToken)
      : null;
  };
  // Closing waits for requests in flight: open long-polls answer "no job" now, not at their end.
  app.addHook('preClose', (done) => {
    dispatch.endTakes();
    done();
  });
  const transactions = new ProxyTransactions({
    connector: deps.datatables,
    ...(deps.proxyLimits ? { limits: deps.proxyLimits } : {}),
    ...(deps.transactionLimits ? { transactions: deps.transactionLimits } : {}),
  });
  deps.onJobEnded?.((job) => void transactions.endJob(job));
  // Once no request is in flight: every transaction still open is rolled back, its lease back.
  app.addHook('onClose', async () => transactions.close());

  app.post<{ Body: { waitMs?: number } }>(
    '/api/agent/jobs/take',
    { schema: { body: takeBody }, config, onRequest },
    async (request, reply) => {
      const abort = new AbortController();
      // The agent hung up (stopping, or its connection dropped): stop waiting on its behalf.
      reply.raw.once('close', () => abort.abort());
      const taken = await dispatch.take(agentOf(request), request.body.waitMs ?? 0, abort.signal);
      if (taken === null) return reply.status(204).send();
      const { job, jobToken, beatMs, traceparent } = taken;
      return reply.send({
        job: {
          id: job.id,
          workspace: job.workspace,
          runnable: job.runnable,
          args: job.args,
          // What `ctx` shows the runnable, as in process; never read back from the agent.
          perms: { email: job.perms.email, endUserEmail: job.perms.endUserEmail },
          ...(job.cacheTtlS === undefined ? {} : { cacheTtlS: job.cacheTtlS }),
        },
        jobToken,
        ...(beatMs === undefined ? {} : { beatMs }),
        ...(traceparent === undefined ? {} : { traceparent }),
      });
    },
  );

  app.post<{ Params: { id: string } }>(
    '/api/agent/jobs/:id/beat',
    { schema: { params: finishParams }, config, onRequest },
    async (request, reply) => {
      if (!dispatch.beat(agentOf(request), request.params.id)) {
        throw new HttpError(404, 'E_UNKNOWN_JOB', 'this agent holds no running job with that id');
      }
      return reply.status(204).send();
    },
  );

  app.post<{
    Params: { id: string };
    Body: { ok: boolean; value?: unknown; code?: string; message?: string; sqlstate?: string };
  }>(
    '/api/agent/jobs/:id/finish',
    {
      schema: { params: finishParams, body: finishBody },
      config,
      onRequest,
      bodyLimit: deps.resultLimitBytes ?? AGENT_RESULT_LIMIT_BYTES,
    },
    async (request, reply) => {
      const { ok, value, code, message, sqlstate } = request.body;
      const outcome: AgentOutcome = ok
        ? { ok: true, value: value ?? null }
        : {
            ok: false,
            code: code ?? 'E_EXECUTOR_FAILED',
            message: message ?? '',
            ...(sqlstate === undefined ? {} : { sqlstate }),
          };
      const agent = agentOf(request);
      const job = jobOfRequest(request, agent);
      const finished = await runTraced(
        job?.id === request.params.id ? traceOf(request) : null,
        'viewer_cache.agent.finish',
        async () => dispatch.finish(agent, request.params.id, outcome),
        {},
        SpanKind.SERVER,
      );
      if (!finished) {
        throw new HttpError(404, 'E_UNKNOWN_JOB', 'this agent holds no running job with that id');
      }
      return reply.status(204).send();
    },
  );

  app.post<{
    Body: {
      reference: ProxiedReference;
      sql: string;
      params?: unknown[];
      copy?: CopyBound;
      transaction?: string | null;
    };
  }>(
    '/api/agent/query',
    { schema: { body: queryBody }, config, onRequest },
    async (request, reply) => {
      const agent = agentOf(request);
      const jobToken = request.headers[JOB_TOKEN_HEADER];
      const traceparent = jobOfRequest(request, agent) === null ? null : traceOf(request);
      const { transaction } = request.body;
      const result = await runTraced(
        traceparent,
        'viewer_cache.agent.query',
        () =>
          transactions.run(
            {
              protocol: AGENT_PROTOCOL_VERSION,
              jobToken: typeof jobToken === 'string' ? jobToken : '',
              reference: request.body.reference,
              sql: request.body.sql,
              params: request.body.params ?? [],
              ...(request.body.copy === undefined ? {} : { copy: request.body.copy }),
              ...(transaction === undefined ? {} : { transaction }),
            },
            { jobOfToken: (token) => dispatch.jobOfToken(agent, token) },
          ),
        {},
        SpanKind.SERVER,
      ).catch((err: unknown) => {
        const failed = statementFailure(err);
        if (failed === null) throw err;
        // A COMMIT Postgres refused ended the transaction: the agent forgets its id.
        return endedItsTransaction(err) ? { ...failed, transaction: null } : failed;
      });
      if ('error' in result) return reply.status(400).send(result);
      return reply.type('application/json').send(result.json);
    },
  );

  app.post<{ Body: { datatable: string; role: string } }>(
    '/api/agent/holds',
    { schema: { body: holdsBody }, config, onRequest },
    async (request) => {
      const agent = agentOf(request);
      const jobToken = request.headers[JOB_TOKEN_HEADER];
      const holds = await runProxiedRoleCheck(
        {
          protocol: AGENT_PROTOCOL_VERSION,
          jobToken: typeof jobToken === 'string' ? jobToken : '',
          datatable: request.body.datatable,
          role: request.body.role,
        },
        {
          jobs: { jobOfToken: (token) => dispatch.jobOfToken(agent, token) },
          connector: deps.datatables,
        },
      );
      return { holds };
    },
  );
}

/**
 * A statement Postgres itself refused (a pg DatabaseError: a SQLSTATE and a severity), answered
 * as `E_QUERY_FAILED` with its SQLSTATE and message, so the runnable on the agent sees what it
 * would see in process (`err.code === '42501'`). The agent runs the job and sees its data; the
 * message is Postgres's about that statement. Null for anything else (our refusals, faults).
 */
function statementFailure(
  err: unknown,
): { error: { code: 'E_QUERY_FAILED'; message: string; sqlstate: string } } | null {
  if (!(err instanceof Error) || err instanceof ViewerCacheError || !('severity' in err))
    return null;
  const sqlstate = (err as { code?: unknown }).code;
  if (typeof sqlstate !== 'string' || !/^[0-9A-Z]{5}$/.test(sqlstate)) return null;
  return { error: { code: 'E_QUERY_FAILED', message: err.message, sqlstate } };
}
