import {
  type Aggregator,
  Counter,
  type CounterConfiguration,
  Histogram,
  type HistogramConfiguration,
  type LabelValues,
  type MetricObjectWithValues,
  type MetricValue,
  type MetricValueWithName,
} from 'prom-client';

// prom-client's `labels(…).inc()` / `.observe(v)` rebuild, validate and hash the label set on
// every call, even on a child resolved once (2 µs of a cached request for two counters and two
// histograms on the 2-core VM). These keep one plain record per label set, made once: counting
// is an add, observing a loop over the bounds. The exposition is prom-client's own text (the
// registry formats what `getForPromString()` returns), checked line for line against a
// prom-client metric given the same values (test/unit/series_metrics.test.ts).

/** One label set's counter: an add. */
export interface CounterSeries {
  inc(): void;
}

/** One label set's histogram: a loop over the bounds and two adds. */
export interface HistogramSeries {
  observe(value: number): void;
}

type Labels = Record<string, string | number>;

/** What the registry reads of a metric (`getForPromString()`), as prom-client 15 shapes it. */
interface Exposition {
  name: string;
  help: string;
  type: string;
  aggregator: Aggregator;
  values: {
    labels: Labels;
    sharedLabels?: Labels;
    value: number;
    metricName?: string;
    exemplar?: null;
  }[];
}

/** The records of `metric`, or none while its constructor is still running. */
function resettable<R>(metric: object, series: () => Map<string, R>): Iterable<R> {
  return constructed.has(metric) ? series().values() : [];
}
const constructed = new WeakSet<object>();

const keyOf = (names: readonly string[], labels: Labels) =>
  names.map((name) => String(labels[name])).join('\u0000');

/** A {@link Counter} whose label sets are {@link CounterSeries}, made once each. */
export class SeriesCounter<T extends string> extends Counter<T> {
  readonly #names: readonly string[];
  readonly #series = new Map<string, { labels: Labels; value: number }>();
  readonly #config: CounterConfiguration<T>;

  constructor(config: CounterConfiguration<T>) {
    super(config);
    this.#config = config;
    this.#names = [...(config.labelNames ?? [])];
    constructed.add(this);
  }

  /** The series of `labels` (every label name given), made on first use. */
  series(labels: LabelValues<T>): CounterSeries {
    const key = keyOf(this.#names, labels as Labels);
    let found = this.#series.get(key);
    if (found === undefined) {
      found = { labels: { ...(labels as Labels) }, value: 0 };
      this.#series.set(key, found);
    }
    const record = found;
    return {
      inc() {
        record.value += 1;
      },
    };
  }

  async getForPromString(): Promise<Exposition> {
    return {
      name: this.#config.name,
      help: this.#config.help,
      type: 'counter',
      aggregator: this.#config.aggregator ?? 'sum',
      values: [...this.#series.values()].map(({ labels, value }) => ({
        labels: { ...labels },
        value,
      })),
    };
  }

  override async get(): Promise<MetricObjectWithValues<MetricValue<T>>> {
    return (await this.getForPromString()) as unknown as MetricObjectWithValues<MetricValue<T>>;
  }

  override reset(): void {
    super.reset();
    // prom-client's constructor calls reset() before this class's fields exist.
    for (const record of resettable(this, () => this.#series)) record.value = 0;
  }
}

/** A {@link Histogram} whose label sets are {@link HistogramSeries}, made once each. */
export class SeriesHistogram<T extends string> extends Histogram<T> {
  readonly #names: readonly string[];
  readonly #bounds: readonly number[];
  readonly #series = new Map<
    string,
    { labels: Labels; buckets: Float64Array; sum: number; count: number }
  >();
  readonly #config: HistogramConfiguration<T>;

  constructor(config: HistogramConfiguration<T> & { buckets: number[] }) {
    super(config);
    this.#config = config;
    this.#names = [...(config.labelNames ?? [])];
    // prom-client keeps them as given (it refuses unsorted ones).
    this.#bounds = [...config.buckets];
    constructed.add(this);
  }

  /** The series of `labels` (every label name given), made on first use. */
  series(labels: LabelValues<T>): HistogramSeries {
    const key = keyOf(this.#names, labels as Labels);
    let found = this.#series.get(key);
    if (found === undefined) {
      found = {
        labels: { ...(labels as Labels) },
        buckets: new Float64Array(this.#bounds.length),
        sum: 0,
        count: 0,
      };
      this.#series.set(key, found);
    }
    const record = found;
    const bounds = this.#bounds;
    return {
      observe(value: number) {
        if (!Number.isFinite(value)) return;
        for (let i = 0; i < bounds.length; i++) {
          if (value <= bounds[i]!) {
            record.buckets[i]! += 1;
            break;
          }
        }
        record.sum += value;
        record.count += 1;
      },
    };
  }

  // prom-client's own shape: each bucket's `le` in `labels`, the series' labels in
  // `sharedLabels` (so the text reads `{le="…",route="…"}`), cumulative counts, then `+Inf`,
  // `_sum` and `_count`.
  async getForPromString(): Promise<Exposition> {
    const name = this.#config.name;
    const bucket = `${name}_bucket`;
    const values: Exposition['values'] = [];
    for (const { labels, buckets, sum, count } of this.#series.values()) {
      let cumulative = 0;
      for (let i = 0; i < this.#bounds.length; i++) {
        cumulative += buckets[i]!;
        values.push({
          labels: { le: this.#bounds[i]! },
          sharedLabels: labels,
          value: cumulative,
          metricName: bucket,
          exemplar: null,
        });
      }
      values.push(
        {
          labels: { le: '+Inf' },
          sharedLabels: labels,
          value: count,
          metricName: bucket,
          exemplar: null,
        },
        { labels: {}, sharedLabels: labels, value: sum, metricName: `${name}_sum` },
        { labels: {}, sharedLabels: labels, value: count, metricName: `${name}_count` },
      );
    }
    return {
      name,
      help: this.#config.help,
      type: 'histogram',
      aggregator: this.#config.aggregator ?? 'sum',
      values,
    };
  }

  override async get(): Promise<MetricObjectWithValues<MetricValueWithName<T>>> {
    const data = await this.getForPromString();
    return {
      ...data,
      values: data.values.map(({ sharedLabels, labels, ...rest }) => ({
        ...rest,
        labels: { ...labels, ...sharedLabels },
      })),
    } as unknown as MetricObjectWithValues<MetricValueWithName<T>>;
  }

  override reset(): void {
    super.reset();
    // prom-client's constructor calls reset() before this class's fields exist.
    for (const record of resettable(this, () => this.#series)) {
      record.buckets.fill(0);
      record.sum = 0;
      record.count = 0;
    }
  }
}
