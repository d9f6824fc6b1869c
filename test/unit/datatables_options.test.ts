import { describe, expect, it } from 'vitest';
import type { RawDatatablesOptions } from '../../src/datatable/datatables_api.js';
import {
  DATATABLES_DEFAULTS,
  resolveDatatablesOptions,
} from '../../src/datatable/datatables_options.js';

// createDatatables resolves its options once, here, before anything connects: defaults from one
// object, and a TypeError naming the option for anything it cannot use.

const base: RawDatatablesOptions = {
  connection: 'postgres://admin:pw@db.example:5433/catalog?application_name=admin-app',
  secretKey: 'k'.repeat(32),
};

const resolve = (extra: Partial<RawDatatablesOptions>) =>
  resolveDatatablesOptions({ ...base, ...extra });

describe('resolveDatatablesOptions', () => {
  it('applies every default of DATATABLES_DEFAULTS, and freezes the result', () => {
    const resolved = resolve({});
    expect(resolved.migrate).toBe(DATATABLES_DEFAULTS.migrate);
    expect(resolved.viewerIdentity).toBe(DATATABLES_DEFAULTS.viewerIdentity);
    expect(resolved.catalog).toEqual({
      heartbeatMs: 1000,
      heartbeatTimeoutMs: 1000,
      awaitPropagation: false,
    });
    expect(resolved.pools).toEqual({
      size: DATATABLES_DEFAULTS.pools.size,
      max: DATATABLES_DEFAULTS.pools.max,
      maxConnections: DATATABLES_DEFAULTS.pools.maxConnections,
      acquireTimeoutMs: 10_000,
      idleTimeoutMs: 30_000,
      statementTimeoutMs: 0,
      prepareAhead: true,
      checkOnRelease: true,
    });
    expect(resolved.directory).toBeNull();
    expect(Object.isFrozen(resolved)).toBe(true);
    expect(Object.isFrozen(resolved.pools)).toBe(true);
    expect(Object.isFrozen(DATATABLES_DEFAULTS.pools)).toBe(true);
  });

  it('reads the connection once: the listener drops its application_name, logins drop the credentials', () => {
    const resolved = resolve({});
    expect(resolved.adminConfig).toMatchObject({
      host: 'db.example',
      port: 5433,
      user: 'admin',
      database: 'catalog',
      application_name: 'admin-app',
    });
    expect(resolved.listenConfig.application_name).toBeUndefined();
    expect(resolved.listenConfig.host).toBe('db.example');
    expect(resolved.loginConfig).toMatchObject({ host: 'db.example', port: 5433 });
    for (const key of ['user', 'password', 'database'] as const) {
      expect(resolved.loginConfig[key]).toBeUndefined();
    }
    const pooled = resolve({ loginConnection: 'postgres://x:y@bouncer:6432/z' });
    expect(pooled.loginConfig).toMatchObject({ host: 'bouncer', port: 6432 });
    expect(pooled.loginConfig.user).toBeUndefined();
  });

  it.each<[string, Partial<RawDatatablesOptions> | null, RegExp]>([
    ['no options', null, /options are required/],
    ['an empty connection', { connection: '' }, /connection must be a postgres:\/\/ URL/],
    ['a short secret', { secretKey: 'short' }, /secretKey must be at least 32 bytes/],
    ['a directory without principals()', { directory: {} as never }, /directory must have/],
    ['pools.size 0', { pools: { size: 0 } }, /pools\.size must be an integer/],
    ['pools.max 1.5', { pools: { max: 1.5 } }, /pools\.max must be an integer/],
    ['pools.maxConnections 0', { pools: { maxConnections: 0 } }, /pools\.maxConnections/],
    ['catalog.heartbeat 0', { catalog: { heartbeat: 0 } }, /catalog\.heartbeat must be greater/],
    [
      'catalog.heartbeatTimeout 0',
      { catalog: { heartbeatTimeout: 0 } },
      /catalog\.heartbeatTimeout must be greater/,
    ],
    [
      'a transaction pooler with a statement timeout',
      { transactionPooler: true, viewerIdentity: false, pools: { statementTimeout: '5s' } },
      /transactionPooler cannot carry pools\.statementTimeout/,
    ],
  ])('refuses %s with a TypeError naming it', (_, extra, message) => {
    const call = () =>
      resolveDatatablesOptions(extra === null ? (null as never) : { ...base, ...extra });
    expect(call).toThrow(TypeError);
    expect(call).toThrow(message);
  });

  it('never puts the secret in an error', () => {
    const secret = 'not-long-enough-secret';
    expect(() => resolve({ secretKey: secret })).toThrow(
      expect.objectContaining({ message: expect.not.stringContaining(secret) }),
    );
  });

  it('accepts a transaction pooler without anything session-scoped', () => {
    const resolved = resolve({ transactionPooler: true, viewerIdentity: false });
    expect(resolved.viewerIdentity).toBe(false);
  });

  it('accepts a transaction pooler with the viewer identity (bound per transaction, issue 24)', () => {
    const resolved = resolve({ transactionPooler: true });
    expect(resolved.viewerIdentity).toBe(true);
    expect(resolved.transactionPooler).toBe(true);
  });
});
