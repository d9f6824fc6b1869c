import { describe, expect, it } from 'vitest';
import { SingleFlight } from '../../src/util/single_flight.js';
import { deferred } from '../helpers/deferred.js';

describe('SingleFlight', () => {
  it('holds one flight per key and forgets it once settled', async () => {
    const flights = new SingleFlight<number>();
    const gate = deferred<number>();
    const flight = flights.run('k', () => gate.promise);
    expect(flights.get('k')).toBe(flight);
    expect(flights.get('other')).toBeUndefined();
    expect(flights.size).toBe(1);
    gate.resolve(7);
    await expect(flight).resolves.toBe(7);
    expect(flights.size).toBe(0);
  });

  it('forgets a flight that rejects', async () => {
    const flights = new SingleFlight<number>();
    const flight = flights.run('k', () => Promise.reject(new Error('boom')));
    await expect(flight).rejects.toThrow('boom');
    expect(flights.get('k')).toBeUndefined();
  });

  it('does not let a finished flight remove a newer one under the same key', async () => {
    const flights = new SingleFlight<number>();
    const first = deferred<number>();
    const second = deferred<number>();
    const a = flights.run('k', () => first.promise);
    const b = flights.run('k', () => second.promise);
    first.resolve(1);
    await a;
    expect(flights.get('k')).toBe(b);
    second.resolve(2);
    await b;
    expect(flights.size).toBe(0);
  });
});
