/*
 * The HTTP API's spans: one SERVER span per request, named by method and route pattern (never
 * the URL: a path segment or query string can carry a token or an args value), child of the
 * caller's `traceparent` when one came (W3C trace context, through the propagator the user's SDK
 * registered). A run started by the request runs inside it, so the run's spans join the trace.
 * Hooked only when an SDK is registered as the app is built: otherwise no hook at all. Not on the
 * agents' routes (see http_agents.ts: their spans join a trace only beside a job's token).
 */
import {
  context,
  propagation,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
} from '@opentelemetry/api';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { sdkTracer } from '../../index.js';

/** Runs work of a request inside its span. */
export type WithinRequest = <T>(request: FastifyRequest, fn: () => Promise<T>) => Promise<T>;

const untraced: WithinRequest = (_request, fn) => fn();

/** Hooks request spans into `app` when tracing is on; returns how to run within one. */
export function traceRequests(app: FastifyInstance): WithinRequest {
  const tracer = sdkTracer();
  if (tracer === null) return untraced;
  const spans = new WeakMap<FastifyRequest, Span>();
  app.addHook('onRequest', (request, _reply, done) => {
    // Agents' requests: their routes make their own spans, joined to a trace only beside the
    // job's token (a `traceparent` alone must not graft spans onto someone's trace), and an
    // idle agent's long-polls are not worth a trace each.
    if (request.routeOptions.url?.startsWith('/api/agent/') === true) {
      done();
      return;
    }
    const parent = propagation.extract(ROOT_CONTEXT, request.headers);
    const span = tracer.startSpan(
      request.method,
      {
        kind: SpanKind.SERVER,
        attributes: {
          'http.request.method': request.method,
          'url.scheme': 'http',
          'network.protocol.version': request.raw.httpVersion,
        },
      },
      parent,
    );
    spans.set(request, span);
    done();
  });
  app.addHook('onResponse', (request, reply, done) => {
    const span = spans.get(request);
    if (span !== undefined) {
      const route = request.routeOptions.url;
      if (route !== undefined) {
        span.updateName(`${request.method} ${route}`);
        span.setAttribute('http.route', route);
      }
      span.setAttribute('http.response.status_code', reply.statusCode);
      if (reply.statusCode >= 500) span.setStatus({ code: SpanStatusCode.ERROR });
      span.end();
    }
    done();
  });
  return (request, fn) => {
    const span = spans.get(request);
    return span === undefined ? fn() : context.with(trace.setSpan(context.active(), span), fn);
  };
}
