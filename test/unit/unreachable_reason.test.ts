import { describe, expect, it } from 'vitest';
import { unreachableReason } from '../../src/pg/sqlstate.js';

// What the datatables layer reads as "the data table's database is unreachable" (then refused
// with E_DATATABLE_UNREACHABLE): the shapes pg and Node give a refused, terminated or timed-out
// connection, wherever they sit on the cause chain; anything else is not.

const coded = (code: string, message = 'x') => Object.assign(new Error(message), { code });

describe('unreachableReason', () => {
  it.each([
    [coded('ECONNREFUSED', 'connect ECONNREFUSED 127.0.0.1:5432'), 'connection refused'],
    [new Error('Connection terminated unexpectedly'), 'connection terminated'],
    [
      coded('57P01', 'terminating connection due to administrator command'),
      'connection terminated',
    ],
    [coded('57P03', 'the database system is starting up'), 'connection terminated'],
    [new Error('timeout exceeded when trying to connect'), 'timed out'],
    [new Error('Connection terminated due to connection timeout'), 'timed out'],
    [coded('ETIMEDOUT'), 'timed out'],
  ])('%s → %s', (err, reason) => {
    expect(unreachableReason(err)).toBe(reason);
    // A step's own coded error wrapping it (the catalog read, the login) says the same.
    expect(unreachableReason(new Error('could not read the catalog', { cause: err }))).toBe(reason);
  });

  it('a statement or a refusal is not unreachability', () => {
    expect(unreachableReason(coded('42501', 'permission denied'))).toBeNull();
    expect(unreachableReason(coded('28P01', 'password authentication failed'))).toBeNull();
    expect(unreachableReason(new Error('no roles'))).toBeNull();
    expect(unreachableReason(null)).toBeNull();
  });
});
