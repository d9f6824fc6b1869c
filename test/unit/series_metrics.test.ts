import { Counter, Histogram, Registry } from 'prom-client';
import { describe, expect, it } from 'vitest';
import { SeriesCounter, SeriesHistogram } from '../../src/server/process/series_metrics.js';

// The request and run metrics count through series made once per label set instead of
// prom-client's per-call label work: /metrics must read exactly as prom-client's own metrics
// would, given the same observations (text and JSON), and a reset must zero them.

const BUCKETS = [0.0001, 0.001, 0.01, 0.1, 1, 10];
const OBSERVED: [string, string, number][] = [
  ['/a', '2xx', 0.00005],
  ['/a', '2xx', 0.0001],
  ['/a', '2xx', 0.0042],
  ['/b/:id', '4xx', 0.5],
  ['/a', '2xx', 12],
  ['/b/:id', '5xx', 1],
  ['/b/:id', '4xx', 0.5],
];

function pair() {
  const theirs = new Registry();
  const ours = new Registry();
  const config = (registry: Registry) => ({
    name: 'vc_test_duration_seconds',
    help: 'latency "quoted" \\ and more',
    labelNames: ['route', 'status_class'] as const,
    buckets: BUCKETS,
    registers: [registry],
  });
  const counterConfig = (registry: Registry) => ({
    name: 'vc_test_requests_total',
    help: 'requests',
    labelNames: ['route', 'status'] as const,
    registers: [registry],
  });
  return {
    theirs,
    ours,
    histogram: { theirs: new Histogram(config(theirs)), ours: new SeriesHistogram(config(ours)) },
    counter: {
      theirs: new Counter(counterConfig(theirs)),
      ours: new SeriesCounter(counterConfig(ours)),
    },
  };
}

describe('series metrics', () => {
  it('read on /metrics exactly as prom-client’s own, text and JSON', async () => {
    const { theirs, ours, histogram, counter } = pair();
    for (const [route, statusClass, value] of OBSERVED) {
      histogram.theirs.labels(route, statusClass).observe(value);
      histogram.ours.series({ route, status_class: statusClass }).observe(value);
      counter.theirs.labels({ route, status: statusClass }).inc();
      counter.ours.series({ route, status: statusClass }).inc();
    }
    expect(await ours.metrics()).toBe(await theirs.metrics());
    expect(await ours.getMetricsAsJSON()).toEqual(await theirs.getMetricsAsJSON());
    expect(await ours.metrics()).toContain(
      'vc_test_duration_seconds_bucket{le="0.01",route="/a",status_class="2xx"} 3',
    );
  });

  it('a series made and not yet used reads 0, as a zeroed prom-client one', async () => {
    const { theirs, ours, histogram, counter } = pair();
    histogram.theirs.zero({ route: '/a', status_class: '2xx' });
    histogram.ours.series({ route: '/a', status_class: '2xx' });
    counter.theirs.labels({ route: '/a', status: '200' }).inc(0);
    counter.ours.series({ route: '/a', status: '200' });
    expect(await ours.metrics()).toBe(await theirs.metrics());
  });

  it('a reset zeroes every series, and a series held before it still counts', async () => {
    const { ours, histogram, counter } = pair();
    const held = histogram.ours.series({ route: '/a', status_class: '2xx' });
    const heldCount = counter.ours.series({ route: '/a', status: '200' });
    held.observe(0.5);
    heldCount.inc();
    ours.resetMetrics();
    expect(await ours.metrics()).toContain(
      'vc_test_duration_seconds_count{route="/a",status_class="2xx"} 0',
    );
    held.observe(0.5);
    heldCount.inc();
    const text = await ours.metrics();
    expect(text).toContain('vc_test_duration_seconds_count{route="/a",status_class="2xx"} 1');
    expect(text).toContain('vc_test_requests_total{route="/a",status="200"} 1');
  });
});
