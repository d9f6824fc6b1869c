/*
 * The agent wire protocol: what crosses between the server's agent routes and an agent worker —
 * the headers, the limits, the shapes of a taken job and of its outcome, and the mapping from a
 * reported code back to an error. It is the only file of the server that the agent process
 * loads (a dependency-cruiser rule holds it to that), so it imports nothing but the library.
 */
import {
  ExecutorFailedError,
  errorClassOf,
  errors,
  isDataException,
  type Job,
  QueryFailedError,
  type ViewerCacheError,
} from '../../index.js';

/** The header every agent request carries: the agent protocol version it speaks. */
export const AGENT_PROTOCOL_HEADER = 'x-viewer-cache-agent-protocol';
/** The header of a query-proxy request: the token of the job the statement is for. */
export const JOB_TOKEN_HEADER = 'x-viewer-cache-job-token';
/** Longest an agent's take may wait for a job (ms): below the server's idle-socket limit. */
export const MAX_TAKE_WAIT_MS = 30_000;

/** Default of the agent routes' `resultLimitBytes`: a Python job's largest output. */
export const AGENT_RESULT_LIMIT_BYTES = 16 << 20;

/** A job as an agent takes it, with the token its data-table requests and children carry. */
export interface TakenJob {
  readonly job: Job;
  readonly jobToken: string;
  /**
   * How often the agent must beat for this job (`POST /api/agent/jobs/:id/beat`) to keep it,
   * when the dispatch needs beats (a job taken from the queue: its lock); absent otherwise.
   */
  readonly beatMs?: number;
  /**
   * The server's trace context for this job (W3C `traceparent`), when the server is traced: sent
   * to the job's holder only; the agent's spans for it join the server's trace, and its
   * proxied-query and finish requests carry it back (honoured beside the job's token only).
   */
  readonly traceparent?: string;
}

/** How an agent ended a job: its value, or the code (and a short message) of its failure. */
export type AgentOutcome =
  | { readonly ok: true; readonly value: unknown }
  | {
      readonly ok: false;
      readonly code: string;
      readonly message: string;
      /** With E_QUERY_FAILED: the SQLSTATE of the statement Postgres refused. */
      readonly sqlstate?: string;
    };

const CODE_RE = /^E_[A-Z0-9_]{1,48}$/;

/**
 * The failure an agent reported, as the error class of its code when it is one of ours (a
 * refusal keeps its status: E_NO_VIEWER is still a 403), E_INVALID_DATA for a statement's data
 * exception, else E_EXECUTOR_FAILED. The agent's
 * text is capped and never logged above debug (it may echo the runnable's data).
 */
export function failureOf(code: string, message: string, sqlstate?: string): ViewerCacheError {
  // A statement's data exception (SQLSTATE class 22, e.g. a NUL byte in an argument) is the
  // caller's bad input, 400 as in process; its text may quote the value, so it is not kept.
  if (isDataException(code)) return new errors.E_INVALID_DATA();
  const text = String(message).slice(0, 500) || 'the runnable failed on the agent';
  // A statement Postgres refused reads as in process: same code, status and SQLSTATE.
  if (code === QueryFailedError.code)
    return new QueryFailedError(text, sqlstate === undefined ? {} : { sqlstate });
  const Coded = CODE_RE.test(code) ? errorClassOf(code) : undefined;
  if (Coded !== undefined) return new Coded(text);
  return new ExecutorFailedError(text);
}
