import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parse } from 'yaml';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import { httpRequest, pollUntil, ROOT } from '../../helpers/server_process.js';

// The Grafana dashboard and the Prometheus rules in docs/observability/ name only metrics and
// labels that /metrics of a running server and worker expose: a renamed metric or label fails
// here, not on an operator's empty panel. The server runs in queue mode with one worker, and
// serves a hit, a miss and a refusal first, so the labelled series exist.

const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-e2e:${prefix}`,
  execution: 'queue',
});
const DIR = join(ROOT, 'docs/observability');
/** Metrics Prometheus itself provides, not ours. */
const PROMETHEUS_OWN = new Set(['up']);
/** Labels Prometheus adds to every series it scrapes, and the histogram bucket bound. */
const PROMETHEUS_LABELS = new Set(['job', 'instance', 'le']);

/** Metric name → the label names its series carry, from an exposition text. */
function exposed(text: string): Map<string, Set<string>> {
  const metrics = new Map<string, Set<string>>();
  const add = (name: string, labels: string[] = []) => {
    const set = metrics.get(name) ?? new Set<string>();
    for (const label of labels) set.add(label);
    metrics.set(name, set);
  };
  for (const line of text.split('\n')) {
    const type = /^# TYPE (\S+) (\S+)/.exec(line);
    if (type !== null) {
      const [, name, kind] = type;
      add(name!);
      if (kind === 'histogram' || kind === 'summary') {
        for (const suffix of ['_bucket', '_sum', '_count']) add(`${name}${suffix}`);
      }
      continue;
    }
    const series = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? /.exec(line);
    if (series === null) continue;
    const labels = [...(series[2] ?? '').matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="/g)].map((m) => m[1]!);
    add(series[1]!, labels);
    // A bucket's labels are its histogram's too (the `_count` is read with them).
    const base = series[1]!.replace(/_(bucket|sum|count)$/, '');
    if (base !== series[1]) {
      for (const suffix of ['_bucket', '_sum', '_count']) add(`${base}${suffix}`, labels);
    }
  }
  return metrics;
}

/** The metric names and the label names one PromQL expression uses. */
function uses(expr: string): { metrics: string[]; labels: string[] } {
  const withoutStrings = expr.replace(/"(?:[^"\\]|\\.)*"/g, '""');
  const metrics = [
    ...new Set(
      [...withoutStrings.matchAll(/\b([a-z_][a-z0-9_]*)\s*(?=\{|\[|\)|$|\s*[=!<>]|\s+and\b)/g)]
        .map((m) => m[1]!)
        .filter((name) => name.startsWith('viewer_cache_') || PROMETHEUS_OWN.has(name)),
    ),
  ];
  const labels = new Set<string>();
  for (const m of withoutStrings.matchAll(/\{([^}]*)\}/g)) {
    for (const l of m[1]!.matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)/g)) labels.add(l[1]!);
  }
  for (const m of withoutStrings.matchAll(/\b(?:by|without)\s*\(([^)]*)\)/g)) {
    for (const l of m[1]!.split(',')) if (l.trim() !== '') labels.add(l.trim());
  }
  return { metrics, labels: [...labels] };
}

function dashboardExprs(): string[] {
  const dashboard = JSON.parse(readFileSync(join(DIR, 'grafana-dashboard.json'), 'utf8')) as {
    panels: { targets: { expr: string }[] }[];
  };
  return dashboard.panels.flatMap((panel) => panel.targets.map((target) => target.expr));
}

function ruleExprs(): string[] {
  const rules = parse(readFileSync(join(DIR, 'prometheus-rules.yml'), 'utf8')) as {
    groups: { rules: { expr: string }[] }[];
  };
  return rules.groups.flatMap((group) => group.rules.map((rule) => rule.expr));
}

let metrics: Map<string, Set<string>>;

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
  await pollUntil(async () => (await e2e.request('GET', '/readyz')).status === 200, 15_000);
  const token = demoToken(SECRET_KEY, 'alice@example.com');
  const run = (body: object, bearer?: string) =>
    e2e.request('POST', '/api/w/demo/apps/orders-dashboard/run', {
      ...(bearer === undefined ? {} : { token: bearer }),
      body,
    });
  expect((await run({ path: 'f/orders/list' }, token)).status).toBe(200); // a miss, on the worker
  expect((await run({ path: 'f/orders/list' }, token)).status).toBe(200); // a hit
  // A refused run: the job's own refusal (no data-table role for dave).
  expect(
    (await run({ path: 'f/orders/list' }, demoToken(SECRET_KEY, 'dave@example.com'))).status,
  ).toBe(403);
  const server = (await e2e.request('GET', '/metrics')).text;
  const worker = (await httpRequest((await e2e.workers[0]!.ready).url, 'GET', '/metrics')).text;
  metrics = exposed(server);
  for (const [name, labels] of exposed(worker)) {
    const set = metrics.get(name) ?? new Set<string>();
    for (const label of labels) set.add(label);
    metrics.set(name, set);
  }
}, 120_000);

afterAll(async () => {
  await e2e.stop();
});

describe.each([
  ['the Grafana dashboard', dashboardExprs],
  ['the Prometheus rules', ruleExprs],
])('%s', (_name, exprs) => {
  it('has expressions, each naming at least one metric', () => {
    const all = exprs();
    expect(all.length).toBeGreaterThan(5);
    for (const expr of all) expect(uses(expr).metrics, expr).not.toEqual([]);
  });

  it('names only metrics and labels a running server and worker expose', () => {
    const missing: string[] = [];
    for (const expr of exprs()) {
      const { metrics: names, labels } = uses(expr);
      for (const name of names) {
        if (!PROMETHEUS_OWN.has(name) && !metrics.has(name)) missing.push(`metric ${name}`);
      }
      const offered = new Set(PROMETHEUS_LABELS);
      for (const name of names) for (const label of metrics.get(name) ?? []) offered.add(label);
      for (const label of labels) {
        if (!offered.has(label)) missing.push(`label ${label} in ${expr.replace(/\s+/g, ' ')}`);
      }
    }
    expect(missing).toEqual([]);
  });
});

describe('the checker', () => {
  it('reads the names and labels of an expression', () => {
    expect(
      uses(
        'sum by (code) (rate(viewer_cache_x_total{code!~"E_A|E_B", route="/a"}[5m])) / up{job="v"}',
      ),
    ).toEqual({ metrics: ['viewer_cache_x_total', 'up'], labels: ['code', 'route', 'job'] });
  });
});
