import { describe, expect, it } from 'vitest';
import { coerceError } from '../../src/errors.js';
import * as api from '../../src/index.js';
import { errors, NoRolesError, RoleNotPermittedError, ViewerCacheError } from '../../src/index.js';

const entries = Object.entries(errors);

describe('error catalogue', () => {
  it('is not empty and every code is E_*', () => {
    expect(entries.length).toBeGreaterThan(10);
    for (const [code] of entries) expect(code).toMatch(/^E_[A-Z_]+$/);
  });

  it.each(entries)('%s: the static code equals its map key', (code, cls) => {
    expect(cls.code).toBe(code);
  });

  it.each(entries)('%s: instances carry code, status, name, message and cause', (code, cls) => {
    const plain = new cls();
    expect(plain).toBeInstanceOf(ViewerCacheError);
    expect(plain).toBeInstanceOf(Error);
    expect(plain.code).toBe(code);
    expect(Number.isInteger(plain.status)).toBe(true);
    expect(plain.status).toBeGreaterThanOrEqual(400);
    expect(plain.status).toBeLessThan(600);
    expect(plain.message.length).toBeGreaterThan(0);
    expect(plain.name).toBe(cls.name);
    expect(plain.name).toMatch(/Error$/);
    expect(plain.cause).toBeUndefined();

    const cause = new Error('underlying');
    const wrapped = new cls('custom message', { cause });
    expect(wrapped.message).toBe('custom message');
    expect(wrapped.cause).toBe(cause);
    expect(wrapped.code).toBe(code);
  });

  it('every class is also a type, narrowed by instanceof, with its literal code', () => {
    const caught: unknown = new NoRolesError(undefined, { datatable: 'main' });
    let typed: NoRolesError | undefined;
    if (caught instanceof NoRolesError) typed = caught;
    expect(typed?.code).toBe('E_NO_ROLES');
    const code: 'E_NO_ROLES' | undefined = typed?.code;
    expect(code).toBe('E_NO_ROLES');
    expect(caught instanceof RoleNotPermittedError).toBe(false);
  });

  it('errors carry the data table and role they are about, and nothing when not given', () => {
    const err: RoleNotPermittedError = new RoleNotPermittedError('nope', {
      datatable: 'main',
      role: 'sales_emea',
    });
    expect(err.datatable).toBe('main');
    expect(err.role).toBe('sales_emea');
    expect(Object.keys(new NoRolesError())).not.toContain('datatable');
  });

  it.each(entries)('%s: its class is exported by name from the package entry', (_, cls) => {
    // `catch (err) { if (err instanceof ConnectionLostError) … }` needs the class itself.
    expect((api as Record<string, unknown>)[cls.name]).toBe(cls);
  });

  it('codes and class names are unique', () => {
    expect(new Set(entries.map(([, cls]) => cls.name)).size).toBe(entries.length);
  });

  it('coerceError normalises anything thrown into an Error', () => {
    const err = new Error('x');
    expect(coerceError(err)).toBe(err);
    expect(coerceError('text').message).toBe('text');
    const odd = { not: 'an error' };
    const coerced = coerceError(odd);
    expect(coerced).toBeInstanceOf(Error);
    expect(coerced.cause).toBe(odd);
    expect(coerced.message).not.toContain('an error');
  });
});
