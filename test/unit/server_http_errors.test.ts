import { describe, expect, it } from 'vitest';
import {
  ExecutorFailedError,
  errors,
  NoViewerError,
  UnknownRunnableError,
} from '../../src/index.js';
import { HttpError, toHttpError } from '../../src/server/http/http_errors.js';

// How the reference server answers what a route threw: coded refusals keep their code and
// status wherever they were raised in the job tree; only genuine faults are 5xx.

/** A pg DatabaseError as the driver raises it (class 22: the value sent was refused). */
function pgError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code, severity: 'ERROR' });
}

describe('toHttpError', () => {
  it("keeps a nested refusal's code and status, with its default message", () => {
    const child = new NoViewerError('viewer alice@example.com has none (detail)');
    const parent = new ExecutorFailedError('runnable f/x failed: child refused', { cause: child });
    expect(toHttpError(parent)).toEqual({
      status: 403,
      code: 'E_NO_VIEWER',
      message: NoViewerError.defaultMessage,
    });
  });

  it("keeps a top-level refusal's own message", () => {
    const error = new UnknownRunnableError('no runnable is registered at "f/nope"');
    expect(toHttpError(error)).toEqual({
      status: 404,
      code: 'E_UNKNOWN_RUNNABLE',
      message: 'no runnable is registered at "f/nope"',
    });
  });

  it('a library InvalidDataError is a 400 E_INVALID_DATA that does not quote the value', () => {
    const error = new errors.E_INVALID_DATA('invalid input syntax for type integer: "secret"');
    expect(toHttpError(error)).toEqual({
      status: 400,
      code: 'E_INVALID_DATA',
      message: errors.E_INVALID_DATA.defaultMessage,
    });
  });

  it('a raw Postgres class-22 error under a runnable failure is a 400 E_INVALID_DATA', () => {
    const raw = pgError('22021', 'invalid byte sequence for encoding "UTF8": 0x00');
    const wrapped = new ExecutorFailedError('runnable f/x failed', { cause: raw });
    expect(toHttpError(wrapped)).toMatchObject({ status: 400, code: 'E_INVALID_DATA' });
    expect(toHttpError(raw)).toMatchObject({ status: 400, code: 'E_INVALID_DATA' });
  });

  it('other Postgres errors and error-coded Node errors stay faults', () => {
    const wrapped = new ExecutorFailedError('runnable f/x failed', {
      cause: pgError('42P01', 'relation "x" does not exist'),
    });
    expect(toHttpError(wrapped)).toEqual({
      status: 500,
      code: 'E_EXECUTOR_FAILED',
      message: ExecutorFailedError.defaultMessage,
    });
    // A Node error with a code that looks like a SQLSTATE, but is not a pg error.
    const node = Object.assign(new Error('x'), { code: '22000' });
    expect(toHttpError(node)).toEqual({
      status: 500,
      code: 'E_INTERNAL',
      message: 'internal error',
    });
  });

  it('a nested 5xx code (a lost connection in a child) keeps its code and status', () => {
    const wrapped = new ExecutorFailedError('runnable f/x failed', {
      cause: new errors.E_CONNECTION_LOST('backend 1234 terminated while reading rows of alice'),
    });
    expect(toHttpError(wrapped)).toEqual({
      status: 503,
      code: 'E_CONNECTION_LOST',
      message: errors.E_CONNECTION_LOST.defaultMessage,
    });
  });

  it("a 5xx never shows its own message (it may quote a runnable's text)", () => {
    const error = new ExecutorFailedError('runnable f/x failed: row alice@example.com');
    expect(toHttpError(error).message).toBe(ExecutorFailedError.defaultMessage);
  });

  it('HttpError and router errors map to their status in the usual shape', () => {
    expect(toHttpError(new HttpError(401, 'E_UNAUTHENTICATED', 'token'))).toEqual({
      status: 401,
      code: 'E_UNAUTHENTICATED',
      message: 'token',
    });
    const tooLong = Object.assign(new Error("'/api/w/aaaa' is exceeding the max param length"), {
      code: 'FST_ERR_MAX_PARAM_LENGTH',
      statusCode: 414,
    });
    expect(toHttpError(tooLong)).toEqual({
      status: 414,
      code: 'E_URI_TOO_LONG',
      message: 'a path segment is too long',
    });
  });
});
