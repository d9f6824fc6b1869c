/*
 * The server's side of an agent run's trace: a PRODUCER span from the moment a miss is handed to
 * the agents until one takes it. Its `traceparent` goes to the holder only, in the taken job, and
 * comes back on that agent's proxied-query and finish requests, which the routes honour only
 * beside the job's own token — so an agent cannot graft spans onto a trace it was not handed.
 */
import { context, ROOT_CONTEXT, type Span, SpanKind, trace } from '@opentelemetry/api';
import { sdkTracer, traceparentOf } from '../../index.js';

/** A miss waiting for an agent: its take span, when traced. */
export interface TakeSpan {
  /** An agent took the job: ends the span; the trace context to hand it (null untraced). */
  taken(): string | null;
  /** No agent took it (timed out, server stopping): ends the span. */
  dropped(): void;
}

const untraced: TakeSpan = { taken: () => null, dropped: () => {} };

/** Starts the take span of a miss under the active context (the run's). */
export function startTakeSpan(): TakeSpan {
  const tracer = sdkTracer();
  if (tracer === null) return untraced;
  const span: Span = tracer.startSpan(
    'viewer_cache.agent.take',
    { kind: SpanKind.PRODUCER },
    context.active(),
  );
  let ended = false;
  return {
    taken() {
      if (ended) return null;
      ended = true;
      const traceparent = traceparentOf(trace.setSpan(ROOT_CONTEXT, span));
      span.end();
      return traceparent;
    },
    dropped() {
      if (ended) return;
      ended = true;
      span.end();
    },
  };
}
