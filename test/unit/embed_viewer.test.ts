import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { canonicalKeyInput } from '../../src/cache/cache_key.js';
import type { DatatableRef } from '../../src/connector/datatable_ref.js';
import type { JobAuthorization } from '../../src/datatable/access/authorization.js';
import { JobAuthorizations } from '../../src/datatable/access/job_authorizations.js';
import type { CatalogSnapshot } from '../../src/datatable/catalog/catalog_snapshot.js';
import { type CatalogRole, CatalogState } from '../../src/datatable/catalog/catalog_state.js';
import { validateTenant } from '../../src/datatable/catalog/directory.js';
import { wantedSetLogins } from '../../src/datatable/logins/login_gc.js';
import {
  cachedResultPath,
  createExecutor,
  type EmbedViewer,
  type Job,
  recordViewer,
  recordViewerIdentity,
} from '../../src/index.js';
import { makeJob } from '../helpers/jobs.js';

// Embed viewers in the job, the key and the authorization: never a signed-in user, never
// anonymous, never another embed viewer.

const WS = 'ws';
const PUBLISHER = 'publisher@example.com';
const EMAIL = 'viewer@host.example';
const embed = (attributes: Record<string, string>, email: string | null = null, app = 'orders') =>
  ({ app, attributes, email }) as EmbedViewer;
const embedJob = (viewer: EmbedViewer, args: Record<string, unknown> = {}): Job => {
  const job = makeJob({ workspace: WS, runAs: PUBLISHER, args });
  return { ...job, perms: { ...job.perms, ...recordViewerIdentity({ kind: 'embed', viewer }) } };
};

describe('recording an embed viewer (SPEC invariant 1, extended)', () => {
  it('an embed origin has no signed-in viewer: recordViewer is null, the embed rides beside it', () => {
    const viewer = embed({ customer_id: 'c1' }, EMAIL);
    expect(recordViewer({ kind: 'embed', viewer })).toBeNull();
    const identity = recordViewerIdentity({ kind: 'embed', viewer });
    expect(identity).toEqual({ endUserEmail: null, embed: viewer });
    expect(Object.isFrozen(identity.embed)).toBe(true);
    // Every other origin: exactly recordViewer, no embed.
    expect(recordViewerIdentity({ kind: 'app', session: { email: EMAIL } })).toEqual({
      endUserEmail: EMAIL,
    });
    expect(recordViewerIdentity({ kind: 'schedule' })).toEqual({ endUserEmail: null });
  });

  it('a child (job token) inherits the embed viewer, never the runner', () => {
    const viewer = embed({ customer_id: 'c1' });
    const parent = { email: PUBLISHER, endUserEmail: null, embed: viewer };
    expect(recordViewerIdentity({ kind: 'job-token', parent: { perms: parent } })).toEqual({
      endUserEmail: null,
      embed: viewer,
    });
  });

  it('createJob records it, and a child job run by the executor carries it on', async () => {
    const seen: Job[] = [];
    const executor = createExecutor({
      runnables: {
        'f/parent': { fn: (_a, ctx) => ctx.runChild('f/child') },
        'f/child': { fn: () => 'child' },
      },
    });
    const spy = {
      run: (job: Job) => {
        seen.push(job);
        return executor.run(job, { dispatcher: spy });
      },
    };
    const job = executor.createJob({
      workspace: WS,
      path: 'f/parent',
      runAs: PUBLISHER,
      origin: { kind: 'embed', viewer: embed({ customer_id: 'c1' }) },
      // Args that look like identity are data, never identity.
      args: { endUserEmail: EMAIL, embed: { attributes: { customer_id: 'c2' } } },
    });
    expect(job.perms).toEqual({
      email: PUBLISHER,
      endUserEmail: null,
      embed: { app: 'orders', attributes: { customer_id: 'c1' }, email: null },
    });
    await spy.run(job);
    expect(seen[1]!.perms.embed).toEqual(job.perms.embed);
    expect(seen[1]!.perms.endUserEmail).toBeNull();
  });

  it.each([
    ['no app', { attributes: {}, email: null }],
    ['a bad app', { app: '../x', attributes: {}, email: null }],
    ['attributes as an array', { app: 'orders', attributes: [], email: null }],
    ['a number attribute', { app: 'orders', attributes: { a: 1 }, email: null }],
    ['an empty email', { app: 'orders', attributes: {}, email: '' }],
    ['a missing email', { app: 'orders', attributes: {} }],
  ])('refuses an embed origin with %s (E_INVALID_JOB)', (_name, viewer) => {
    expect(() => recordViewerIdentity({ kind: 'embed', viewer: viewer as EmbedViewer })).toThrow(
      expect.objectContaining({ code: 'E_INVALID_JOB' }),
    );
  });
});

describe('the embed viewer in the cache key (SPEC invariant 3)', () => {
  it('keys of runs without an embed viewer are unchanged (no format bump)', () => {
    const job = makeJob({ viewer: 'a@x.io', args: { q: 1 } });
    expect(canonicalKeyInput(job, 'fp')).toBe('[1,"ws","f/app/report","h1","a@x.io","fp",{"q":1}]');
    expect(canonicalKeyInput({ ...job, perms: { ...job.perms, endUserEmail: null } })).toBe(
      '[1,"ws","f/app/report","h1",null,null,{"q":1}]',
    );
  });

  it('the viewer element is the canonical claims object, never a token', () => {
    const input = canonicalKeyInput(embedJob(embed({ z: '2', a: '1' }, EMAIL)), 'fp');
    expect(input).toBe(
      '[1,"ws","f/app/report","h1",{"app":"orders","attributes":{"a":"1","z":"2"},"email":"viewer@host.example","kind":"embed"},"fp",{}]',
    );
    // The object is valid JSON and the whole input parses back to the same claims.
    expect(JSON.parse(input)[4]).toEqual({
      app: 'orders',
      attributes: { a: '1', z: '2' },
      email: EMAIL,
      kind: 'embed',
    });
  });

  const attributesArb = fc.dictionary(
    fc.stringMatching(/^[A-Za-z_][A-Za-z0-9_]{0,8}$/),
    fc.string({ maxLength: 12 }),
    { maxKeys: 5 },
  );
  const viewerArb = fc.record({
    app: fc.constantFrom('orders', 'billing'),
    attributes: attributesArb,
    email: fc
      .option(fc.constantFrom(EMAIL, 'b@x.io', ''), { nil: null })
      .map((e) => (e === '' ? null : e)),
  });

  it('two embeds share a key exactly when app, attributes and email are all equal', () => {
    fc.assert(
      fc.property(viewerArb, viewerArb, (a, b) => {
        const same =
          a.app === b.app &&
          a.email === b.email &&
          JSON.stringify(Object.entries(a.attributes).sort()) ===
            JSON.stringify(Object.entries(b.attributes).sort());
        const ka = cachedResultPath(embedJob(a as EmbedViewer), 'fp');
        const kb = cachedResultPath(embedJob(b as EmbedViewer), 'fp');
        expect(ka === kb).toBe(same);
      }),
      { numRuns: 2000 },
    );
  });

  it('differing in any one attribute value, name, or presence ⇒ different keys', () => {
    fc.assert(
      fc.property(
        viewerArb.filter((v) => Object.keys(v.attributes).length > 0),
        fc.nat(),
        fc.string({ maxLength: 12 }),
        fc.constantFrom('value', 'drop', 'rename'),
        (viewer, pick, other, how) => {
          const names = Object.keys(viewer.attributes);
          const name = names[pick % names.length]!;
          const changed: Record<string, string> = { ...viewer.attributes };
          if (how === 'value') {
            fc.pre(other !== changed[name]);
            changed[name] = other;
          } else if (how === 'drop') {
            delete changed[name];
          } else {
            fc.pre(!(`${name}x` in changed));
            changed[`${name}x`] = changed[name]!;
            delete changed[name];
          }
          expect(
            cachedResultPath(embedJob({ ...viewer, attributes: changed } as EmbedViewer)),
          ).not.toBe(cachedResultPath(embedJob(viewer as EmbedViewer)));
        },
      ),
      { numRuns: 1000 },
    );
  });

  it('an embed viewer never shares a key with a signed-in user of the same email, nor with nobody', () => {
    fc.assert(
      fc.property(
        viewerArb,
        fc.constantFrom(EMAIL, 'b@x.io'),
        fc.constantFrom('fp', null),
        (v, email, fp) => {
          const embedded = cachedResultPath(embedJob(v as EmbedViewer), fp);
          const user = makeJob({ workspace: WS, runAs: PUBLISHER, viewer: email });
          const nobody = makeJob({ workspace: WS, runAs: PUBLISHER, viewer: null });
          expect(embedded).not.toBe(cachedResultPath(user, fp));
          expect(embedded).not.toBe(cachedResultPath(nobody, fp));
        },
      ),
      { numRuns: 500 },
    );
  });

  it('attribute text that spells JSON cannot forge another viewer', () => {
    const a = embed({ a: '1","b":"2' });
    const b = embed({ a: '1', b: '2' });
    expect(cachedResultPath(embedJob(a))).not.toBe(cachedResultPath(embedJob(b)));
  });

  it('an attribute named __proto__ is refused, not silently dropped', () => {
    const attributes = JSON.parse('{"__proto__":"x","a":"1"}') as Record<string, string>;
    expect(() => embedJob(embed(attributes))).toThrow(
      expect.objectContaining({ code: 'E_INVALID_JOB' }),
    );
  });

  it('a job with both a signed-in viewer and an embed viewer is refused', () => {
    const job = embedJob(embed({}));
    expect(() =>
      cachedResultPath({ ...job, perms: { ...job.perms, endUserEmail: EMAIL } }),
    ).toThrow(expect.objectContaining({ code: 'E_INVALID_JOB' }));
  });

  it('…wherever a job is read: the key, the authorization, and a child of such a job', () => {
    const job = embedJob(embed({}));
    const both = { ...job, perms: { ...job.perms, endUserEmail: EMAIL } };
    const refused = expect.objectContaining({ code: 'E_INVALID_JOB' });
    expect(() => canonicalKeyInput(both)).toThrow(refused);
    expect(() => new JobAuthorizations(snapshot, null).of(both)).toThrow(refused);
    expect(() =>
      recordViewerIdentity({ kind: 'job-token', parent: { perms: both.perms } }),
    ).toThrow(refused);
  });
});

// ---------------------------------------------------------------------------------------------

function role(oid: number, name: string, tenants: string[]): CatalogRole {
  return {
    oid,
    workspace: WS,
    datatable: 'main',
    name,
    enabled: true,
    version: 0,
    tenants,
    secret: Buffer.alloc(0),
    safe: true,
  };
}

const state = new CatalogState(
  1,
  [{ workspace: WS, name: 'main', database: 'db1', defaultRole: null }],
  [
    role(101, 'everyone', ['*']),
    role(102, 'by_email', [`user:${EMAIL}`]),
    role(103, 'embed_any', ['embed:*']),
    role(104, 'embed_orders', ['embed:orders']),
    role(105, 'embed_billing', ['embed:billing']),
    role(106, 'grouped', ['group:g']),
  ],
  [{ workspace: WS, email: EMAIL, kind: 'group', name: 'g' }],
  'catalog',
);
const snapshot = {
  freshState: () => state,
  current: async () => state,
} as unknown as CatalogSnapshot;
const viewerRef: DatatableRef = { name: 'main', access: { kind: 'viewer' } };
const rolesOf = (authorization: JobAuthorization | Promise<JobAuthorization>) => {
  try {
    return (authorization as JobAuthorization)
      .grant(viewerRef)
      .roles.map((r) => r.name)
      .join(',');
  } catch (err) {
    return (err as { code: string }).code;
  }
};

describe('embed tenants: an embed viewer has no roles of their own', () => {
  it('validates embed:* and embed:APP, refuses other embed spellings', () => {
    expect(validateTenant('embed:*')).toBe('embed:*');
    expect(validateTenant('embed:orders')).toBe('embed:orders');
    for (const bad of ['embed:', 'embed:Orders', 'embed:a b', 'embed:**', 'embed']) {
      expect(() => validateTenant(bad)).toThrow(expect.objectContaining({ code: 'E_CATALOG' }));
    }
  });

  it('resolves to embed:* and embed:APP roles only — never *, user:EMAIL or a group', () => {
    const authorizations = new JobAuthorizations(snapshot, null);
    expect(rolesOf(authorizations.of(embedJob(embed({ c: '1' }, EMAIL))))).toBe(
      'embed_any,embed_orders',
    );
    expect(rolesOf(authorizations.of(embedJob(embed({}, null, 'billing'))))).toBe(
      'embed_any,embed_billing',
    );
    expect(rolesOf(authorizations.of(embedJob(embed({}, null, 'other'))))).toBe('embed_any');
    // And the signed-in user with the same email never resolves to an embed role.
    const user = makeJob({ workspace: WS, runAs: PUBLISHER, viewer: EMAIL });
    expect(rolesOf(authorizations.of(user))).toBe('everyone,by_email,grouped');
  });

  it('hasRole (viewerHolds) answers per the embed roles only', () => {
    const authorizations = new JobAuthorizations(snapshot, null);
    const a = authorizations.of(embedJob(embed({}, EMAIL))) as JobAuthorization;
    expect(a.viewerHolds('main', 'embed_orders')).toBe(true);
    for (const name of ['everyone', 'by_email', 'grouped', 'embed_billing']) {
      expect(a.viewerHolds('main', name)).toBe(false);
    }
  });

  it('the memo never hands an embed viewer’s authorization to nobody, or back (either order)', () => {
    for (const embedFirst of [true, false]) {
      const authorizations = new JobAuthorizations(snapshot, null);
      const nobody = makeJob({ workspace: WS, runAs: PUBLISHER, viewer: null });
      const embedded = embedJob(embed({}));
      const order = embedFirst ? [embedded, nobody] : [nobody, embedded];
      const results = order.map((job) => rolesOf(authorizations.of(job)));
      expect(results).toEqual(
        embedFirst
          ? ['embed_any,embed_orders', 'E_NO_VIEWER']
          : ['E_NO_VIEWER', 'embed_any,embed_orders'],
      );
      expect(fullFingerprint(authorizations, embedded)).not.toBe(
        fullFingerprint(authorizations, nobody),
      );
      // Two apps' embed viewers, one runner: two authorizations.
      expect(rolesOf(authorizations.of(embedJob(embed({}, null, 'billing'))))).toBe(
        'embed_any,embed_billing',
      );
    }
  });

  it('logins gc keeps the set logins embed viewers resolve to', async () => {
    const wanted = await wantedSetLogins(state, (ws, email) => state.principals(ws, email));
    const sets = [...wanted.values()].map((w) => w.oids.join(','));
    expect(sets).toEqual(expect.arrayContaining(['103,104', '103,105']));
  });
});

/** The full (workspace-wide) fingerprint of a job: what every reference would grant it. */
function fullFingerprint(authorizations: JobAuthorizations, job: Job): string {
  return (authorizations.of(job) as JobAuthorization).fingerprint;
}
