import { STATUS_CODES } from 'node:http';
import type { Socket } from 'node:net';
import { errors, isDataException, ViewerCacheError } from '../../index.js';

/** An error answer: a stable code and a message safe to show (never data, never identities). */
export class HttpError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export interface HttpErrorBody {
  readonly status: number;
  readonly code: string;
  readonly message: string;
}

type Thrown = Error & { statusCode?: number; code?: unknown; validation?: unknown };

/** How deep a cause chain is followed (a child job's refusal sits one or two levels down). */
const MAX_CAUSE_DEPTH = 8;
const defaultMessage = (error: ViewerCacheError): string =>
  (error.constructor as { defaultMessage?: string }).defaultMessage ?? 'internal error';

/**
 * The class's default message, naming the data table when the refusal is about its database
 * being unreachable (the name passed the reference grammar: a safe identifier, never data).
 */
function safeMessage(error: ViewerCacheError): string {
  if (error.code === errors.E_DATATABLE_UNREACHABLE.code && error.datatable !== undefined)
    return `data table "${error.datatable}" is unavailable: its database is unreachable; retry once it is back`;
  return defaultMessage(error);
}

/**
 * The answer for anything a route threw. A coded refusal keeps its code and status wherever in
 * the job tree it was raised (a child job's E_NO_VIEWER is a 403, even wrapped in the parent's
 * failure); a Postgres data exception is the client's 400 E_INVALID_DATA; only what is left is
 * a genuine fault (5xx). Messages of nested or 5xx errors are replaced by their class's default
 * (they may carry a runnable's text, args or rows).
 */
export function toHttpError(error: Thrown): HttpErrorBody {
  if (error instanceof HttpError)
    return { status: error.status, code: error.code, message: error.message };
  const refusal = codedRefusal(error);
  if (refusal !== null) return refusal;
  if (error instanceof ViewerCacheError) {
    const message = error.status < 500 ? error.message : safeMessage(error);
    return { status: error.status, code: error.code, message };
  }
  if (error.validation !== undefined) {
    // Ajv's text names the field and the rule ("body/path must be string"), never the value.
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
    case 'FST_ERR_MAX_PARAM_LENGTH':
      return { status: 414, code: 'E_URI_TOO_LONG', message: 'a path segment is too long' };
    case 'FST_ERR_BAD_URL':
    case 'FST_ERR_ASYNC_CONSTRAINT':
      return { status: 400, code: 'E_BAD_REQUEST', message: 'malformed URL' };
  }
  if (error.statusCode !== undefined && error.statusCode >= 400 && error.statusCode < 500) {
    return { status: error.statusCode, code: 'E_BAD_REQUEST', message: 'bad request' };
  }
  return { status: 500, code: 'E_INTERNAL', message: 'internal error' };
}

/**
 * The most specific coded answer along `error`'s cause chain: the first error with its own code
 * (a child job's E_NO_VIEWER under the parent's E_EXECUTOR_FAILED), or a Postgres data exception
 * (which the library reports as InvalidDataError; a raw one that reaches the server is mapped the
 * same way). Null when the chain holds neither.
 */
function codedRefusal(error: unknown): HttpErrorBody | null {
  let current: unknown = error;
  for (let depth = 0; depth < MAX_CAUSE_DEPTH && current instanceof Error; depth++) {
    if (current instanceof ViewerCacheError && current.code !== errors.E_EXECUTOR_FAILED.code) {
      // Only a top-level refusal's own message is meant for the caller: a nested one's may quote
      // data from deeper in the job tree, a 5xx's a runnable's text, a data exception's the value.
      const own =
        depth === 0 && current.status < 500 && current.code !== errors.E_INVALID_DATA.code;
      return {
        status: current.status,
        code: current.code,
        message: own ? current.message : safeMessage(current),
      };
    }
    const sqlstate = (current as { code?: unknown }).code;
    // `severity` tells a pg DatabaseError from a Node or Fastify error that has a `code` too.
    if (isDataException(sqlstate) && 'severity' in current) {
      return {
        status: 400,
        code: errors.E_INVALID_DATA.code,
        message: errors.E_INVALID_DATA.defaultMessage,
      };
    }
    current = current.cause;
  }
  return null;
}

/**
 * Answers what Node refuses before Fastify sees a request (a request not received within the
 * timeout, headers or URL over 16 KiB, a malformed request line), in the usual error format and
 * without echoing anything the client sent, then closes the connection.
 */
export function answerClientError(error: Error & { code?: string }, socket: Socket): void {
  if (error.code === 'ECONNRESET' || socket.destroyed) return;
  const [status, code, message] =
    error.code === 'ERR_HTTP_REQUEST_TIMEOUT'
      ? [408, 'E_REQUEST_TIMEOUT', 'the request was not received in time']
      : error.code === 'HPE_HEADER_OVERFLOW'
        ? [431, 'E_HEADERS_TOO_LARGE', 'the URL or the headers are too large']
        : [400, 'E_BAD_REQUEST', 'malformed HTTP request'];
  const body = JSON.stringify({ error: { code, message } });
  if (!socket.writable) {
    socket.destroy();
    return;
  }
  socket.end(
    `HTTP/1.1 ${status} ${STATUS_CODES[status]}\r\nContent-Type: application/json; charset=utf-8\r\n` +
      'Cache-Control: no-store\r\n' +
      `Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
  );
}
