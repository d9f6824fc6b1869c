import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';

// The explain route of the reference server: a workspace admin (the demo's publisher) is told
// how a run of dana's would read; dana herself, not an admin, is refused before anything is read.

const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-explain:${prefix}`,
  execution: 'in-process',
});
const token = (email: string) => demoToken(SECRET_KEY, email);
const PATH = '/api/w/demo/apps/clinics/explain';
const body = { path: 'f/clinics/patients', viewer: { email: 'dana@example.com' } };

beforeAll(async () => {
  await e2e.start();
  await e2e.ready();
}, 120_000);
afterAll(async () => {
  await e2e.stop();
});

describe('POST /api/w/:ws/apps/:app/explain', () => {
  it('is refused to anyone but a workspace admin', async () => {
    const answer = await e2e.request('POST', PATH, { token: token('dana@example.com'), body });
    expect(answer.status).toBe(403);
    expect((answer.json as { error: { code: string } }).error.code).toBe('E_FORBIDDEN');
    expect(answer.headers.get('cache-control')).toBe('private, no-store');
  });

  it("tells an admin dana's roles and who named them, and the narrowed login", async () => {
    const answer = await e2e.request('POST', PATH, { token: token('publisher@example.com'), body });
    expect(answer.status).toBe(200);
    const e = answer.json as {
      viewer: { recorded: string };
      roles: { role: string; namedBy: string[] }[];
      entry: { state: string };
    };
    expect(e.viewer.recorded).toBe('dana@example.com');
    expect(e.roles.map((r) => [r.role, r.namedBy])).toEqual(
      expect.arrayContaining([
        [`${prefix}provider`, ['group:providers']],
        [`${prefix}system_admin`, ['group:system_admins']],
      ]),
    );
    expect(answer.text).not.toContain('P. Irwin');
  });
});
