/*
 * Traces through `@opentelemetry/api` only: the user's SDK, when one is registered, receives
 * them; without one nothing is allocated on the hot paths (each traced object asks once, when it
 * is built, or — off the hit path — per call, which costs one property read).
 *
 * What a span may carry is the point of this file. Traces are the easiest place to leak what the
 * cache protects, so every attribute here is from a fixed vocabulary: workspace, runnable path,
 * outcome, error code, SQLSTATE, kinds (access, login, store operation), sizes and counts. Never
 * a viewer, an email, an args value, a row, a key name, a token, or an error's message (a
 * Postgres message quotes values: `invalid input syntax for type integer: "…"`). Statement text
 * only when the user opts in, and then with every literal replaced by `?`.
 */
import {
  type Attributes,
  type Context,
  context,
  ProxyTracerProvider,
  propagation,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  type Tracer,
  trace,
} from '@opentelemetry/api';

/** The instrumentation scope every span of the library is created under. */
export const TRACER_NAME = 'viewer-cache';

/** What the API's global provider delegates to before any SDK registers one. */
const NOOP_DELEGATE = new ProxyTracerProvider().getDelegate();

/**
 * The library's tracer when an OpenTelemetry SDK has registered a tracer provider, else null.
 * Cheap enough to ask per call off the hit path; hit paths ask once, at construction.
 */
export function sdkTracer(): Tracer | null {
  const provider = trace.getTracerProvider();
  if (provider instanceof ProxyTracerProvider && provider.getDelegate() === NOOP_DELEGATE) {
    return null;
  }
  return provider.getTracer(TRACER_NAME);
}

/** The code (and SQLSTATE) of a thrown value: what a span may say of an error. */
export function errorAttributes(err: unknown): Attributes {
  const code = (err as { code?: unknown } | null)?.code;
  const attributes: Attributes = {};
  if (typeof code === 'string' && /^E_[A-Z0-9_]{1,48}$/.test(code)) {
    attributes['error.type'] = code;
  } else if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) {
    attributes['error.type'] = 'E_QUERY_FAILED';
    attributes['db.response.status_code'] = code;
  } else {
    attributes['error.type'] = 'E_INTERNAL';
  }
  const sqlstate = sqlstateInCause(err);
  if (sqlstate !== null) attributes['db.response.status_code'] = sqlstate;
  return attributes;
}

/** Marks `span` failed with `err`'s code only (never its message), and ends it. */
export function endWithError(span: Span, err: unknown): void {
  span.setAttributes(errorAttributes(err));
  span.setStatus({ code: SpanStatusCode.ERROR });
  span.end();
}

/**
 * Runs `fn` inside a new active span `name` (children nest under it), ending it when the promise
 * settles: failed with the error's code, or as `fn` left it.
 */
export function inSpan<T>(
  tracer: Tracer,
  name: string,
  attributes: Attributes,
  fn: (span: Span) => Promise<T>,
  kind: SpanKind = SpanKind.INTERNAL,
  parent: Context = context.active(),
): Promise<T> {
  return tracer.startActiveSpan(name, { kind, attributes }, parent, (span) =>
    fn(span).then(
      (value) => {
        span.end();
        return value;
      },
      (err: unknown) => {
        endWithError(span, err);
        throw err;
      },
    ),
  );
}

/** `fn` inside an internal span `name` when an SDK is registered now; else just `fn`. */
export function traced<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const tracer = sdkTracer();
  return tracer === null ? fn() : inSpan(tracer, name, {}, fn);
}

const FIRST_WORD = /^\s*(?:(?:--[^\n]*\n|\/\*[\s\S]*?\*\/)\s*)*([A-Za-z]+)/;

/** The statement's operation (`SELECT`, `INSERT`, …) — the first keyword, upper-cased. */
export function operationOf(text: string): string {
  const word = FIRST_WORD.exec(text)?.[1];
  return word === undefined ? 'UNKNOWN' : word.toUpperCase();
}

/**
 * `text` with every literal replaced by `?`: quoted strings (standard, escape and dollar-quoted),
 * numbers, and comments dropped — what the database semantic conventions call a sanitized query.
 * Identifiers (`"…"`) stay: they name tables and columns, not values.
 */
export function sanitizeStatement(text: string): string {
  return text
    .replace(/\/\*[\s\S]*?\*\//g, ' ')
    .replace(/--[^\n]*/g, ' ')
    .replace(/\$([A-Za-z_][A-Za-z0-9_]*)?\$[\s\S]*?\$\1\$/g, '?')
    .replace(/[eE]'(?:[^'\\]|\\.|'')*'/g, '?')
    .replace(/'(?:[^']|'')*'/g, '?')
    .replace(/(?<![A-Za-z0-9_$"])-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?\b/g, '?')
    .replace(/\s+/g, ' ')
    .trim();
}

function sqlstateInCause(err: unknown): string | null {
  let at: unknown = err;
  for (let depth = 0; depth < 5 && at !== null && typeof at === 'object'; depth++) {
    const code = (at as { code?: unknown }).code;
    if (typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return code;
    const sqlstate = (at as { sqlstate?: unknown }).sqlstate;
    if (typeof sqlstate === 'string' && /^[0-9A-Z]{5}$/.test(sqlstate)) return sqlstate;
    at = (at as { cause?: unknown }).cause;
  }
  return null;
}

const TRACEPARENT = /^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$/;

/** The W3C `traceparent` of `ctx` (through the propagator the SDK registered), or null. */
export function traceparentOf(ctx: Context): string | null {
  const carrier: Record<string, string> = {};
  propagation.inject(ctx, carrier);
  const value = carrier['traceparent'];
  return value !== undefined && TRACEPARENT.test(value) ? value : null;
}

/**
 * Runs `fn` in a CONSUMER span `name` that continues the trace `traceparent` names (a job taken
 * from the queue, its context sealed with it); without an SDK, or without a context, just `fn`.
 */
export function runTraced<T>(
  traceparent: string | null,
  name: string,
  fn: () => Promise<T>,
  attributes: Attributes = { 'messaging.system': 'bullmq' },
  kind: SpanKind = SpanKind.CONSUMER,
): Promise<T> {
  const tracer = sdkTracer();
  if (tracer === null) return fn();
  const parent =
    traceparent !== null && TRACEPARENT.test(traceparent)
      ? propagation.extract(ROOT_CONTEXT, { traceparent })
      : ROOT_CONTEXT;
  return inSpan(tracer, name, attributes, fn, kind, parent);
}

/**
 * Runs `fn` (a request to another process) in a CLIENT span `name` under the active context,
 * handing it that span's `traceparent` to send along; without an SDK, `fn(null)`.
 */
export function clientTraced<T>(
  name: string,
  fn: (traceparent: string | null) => Promise<T>,
): Promise<T> {
  const tracer = sdkTracer();
  if (tracer === null) return fn(null);
  return inSpan(tracer, name, {}, () => fn(traceparentOf(context.active())), SpanKind.CLIENT);
}

export { SpanKind };
