import { describe, expect, it } from 'vitest';
import type { AppsDefinition } from '../../src/server/apps/apps.js';
import { serveAppsDefinitions } from '../../src/server/apps/apps_loader.js';

// The apps module's `audit` field: what `viewer-cache audit` may run is checked on load, and a
// mistake refuses the module naming the field (as every other field of it).

const context = {
  childRunUrl: () => new URL('http://localhost/'),
  env: {},
};
const base: AppsDefinition = {
  runnables: { 'f/a': { fn: () => 1 }, 'f/b': { fn: () => 2 } },
  apps: { app: { publisher: 'p@example.com', public: false, runnables: ['f/a', 'f/b'] } },
};
const serve = (audit: unknown) =>
  serveAppsDefinitions([{ exported: { ...base, audit } as AppsDefinition, label: 'm' }], context);

describe('the audit field of an apps module', () => {
  it('defaults to nothing audited', async () => {
    const served = await serveAppsDefinitions([{ exported: base, label: 'm' }], context);
    expect(served.audit).toEqual({ runnables: {}, intended: {} });
  });

  it('spells `true` out and keeps args, expectations and intended objects', async () => {
    const served = await serve({
      runnables: { 'f/a': true, 'f/b': { args: { x: 1 }, expect: { noColumns: ['name'] } } },
      intended: { 'public.v': 'an aggregate view' },
    });
    expect(served.audit.runnables).toEqual({
      'f/a': {},
      'f/b': { args: { x: 1 }, expect: { noColumns: ['name'] } },
    });
    expect(served.audit.intended).toEqual({ 'public.v': 'an aggregate view' });
  });

  it.each([
    [{ runnables: { 'f/nope': true } }, 'audit.runnables["f/nope"] names no runnable'],
    [{ runnables: { 'f/a': { sendMail: true } } }, 'unknown field "sendMail"'],
    [{ runnables: { 'f/a': { expect: { noColumns: 'name' } } } }, 'noColumns must be an array'],
    [{ runnables: {}, intended: { 'public.v': 1 } }, 'audit.intended must map'],
    [{ runs: {} }, 'audit: unknown field "runs"'],
  ])('refuses %j', async (audit, message) => {
    await expect(serve(audit)).rejects.toMatchObject({
      code: 'E_APPS_MODULE_INVALID',
      message: expect.stringContaining(message),
    });
  });
});
