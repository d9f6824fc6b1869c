// The part of autocannon 9's API the outsider benches use (it ships no types; @types/autocannon
// would be one more dependency for five fields).
declare module 'autocannon' {
  interface Options {
    url: string;
    method?: string;
    connections?: number;
    duration?: number;
    headers?: Record<string, string>;
    body?: string;
  }
  interface Histogram {
    average: number;
    p50: number;
    p99: number;
  }
  interface Result {
    requests: Histogram;
    latency: Histogram;
    non2xx: number;
    errors: number;
  }
  interface Instance {
    /** Every response, with its time in ms (a float: the result's histogram keeps whole ms). */
    on(
      event: 'response',
      fn: (client: unknown, status: number, bytes: number, ms: number) => void,
    ): void;
  }
  function autocannon(
    options: Options,
    done: (err: Error | null, result: Result) => void,
  ): Instance;
  export default autocannon;
}
