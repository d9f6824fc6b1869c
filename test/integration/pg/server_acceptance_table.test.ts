import { randomBytes } from 'node:crypto';
import type { JWK } from 'jose';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createDatatables, signEmbedAssertion } from '../../../src/index.js';
import { demoToken } from '../../../src/server/credentials/tokens.js';
import { uniquePrefix } from '../../helpers/pg.js';
import { E2eServer } from '../../helpers/server_e2e.js';
import {
  expectNoSecrets as expectNoSecretsIn,
  expectOk,
  expectRefused as expectRefusedWith,
  type Secrets,
} from '../../helpers/server_expect.js';
import { type Answer, asRun, pollUntil, type RunAnswer } from '../../helpers/server_process.js';

// The table "What each viewer sees" of the row-level-security guide
// (seeds/textql-row-level-security.md), run row by row through the reference server's HTTP API
// against the second demo app (src/server/demo/demo_clinics.ts): patients with their provider and
// health system, an entitlements table keyed by email, clinics. Postgres is the judge: the
// policies read the run's viewer with viewer_cache.viewer_email(). Every row is checked again on
// a cache hit, and the guide's two revocations on the viewer's next run. The guide's rules are
// per query: patient detail requires the provider role and filters by the provider's email
// whatever other roles the viewer holds (so a provider who is also a system administrator — Dana
// — sees her own patients only); the counts count every patient of the viewer's entitled health
// systems, for a provider or a system administrator alike, and never return a patient row.

const WS = 'demo';
const NORA = 'nora@example.com'; // provider, North
const NICK = 'nick@example.com'; // second provider, North
const SAM = 'sam@example.com'; // provider, South
const ADA = 'ada@example.com'; // North system administrator
const RITA = 'rita@example.com'; // provider role, no entitlement row
const NOBODY = 'nobody@example.com'; // in no group: no roles at all
const PUBLISHER = 'publisher@example.com';
const DANA = 'dana@example.com'; // provider and North system administrator (seeded)
const OLIVE = 'olive@example.com'; // provider and North system administrator, with scoped keys

const prefix = uniquePrefix();
const SECRET_KEY = randomBytes(32).toString('hex');
/** Tokens made with `token create` for people the demo does not seed (by email). */
const made: Record<string, string> = {};
/** Embed links signed by the test: like tokens, never to appear in a log line. */
const embedLinks: string[] = [];
/** The embed links the embed row signed, with the counts each must see (the twins reuse them). */
const embedViewers: { link: string; counts: unknown }[] = [];
const token = (email: string) => made[email] ?? demoToken(SECRET_KEY, email);

interface Patient {
  patient_id: number;
  name: string;
  clinic: string;
}
const PATIENTS: Patient[] = [
  { patient_id: 1, name: 'P. Ames', clinic: 'n1' },
  { patient_id: 2, name: 'P. Brook', clinic: 'n2' },
  { patient_id: 3, name: 'P. Chen', clinic: 'n1' },
  { patient_id: 4, name: 'P. Diaz', clinic: 'n2' },
  { patient_id: 5, name: 'P. Evans', clinic: 's1' },
  { patient_id: 6, name: 'P. Ford', clinic: 's1' },
  { patient_id: 9, name: 'P. Irwin', clinic: 'n2' },
];
const patients = (...ids: number[]) => PATIENTS.filter((p) => ids.includes(p.patient_id));
const NORAS = patients(1, 2); // never 7: her South patient, where she has no entitlement
const NICKS = patients(3, 4);
const SAMS = patients(5, 6);
const DANAS = patients(9);
/** Every North patient: n1 holds 1, 3 and 8 (Rita's); n2 holds 2, 4 and 9 (Dana's). */
const NORTH_COUNTS = [
  { clinic: 'n1', patients: 3 },
  { clinic: 'n2', patients: 3 },
];
/** Every South patient: 5, 6, and Nora's 7 (she is not entitled to South). */
const SOUTH_COUNTS = [{ clinic: 's1', patients: 3 }];

const e2e = new E2eServer({
  prefix,
  secretKey: SECRET_KEY,
  redisUrl: inject('redisUrl'),
  redisPrefix: `vc-acc:${prefix}`,
});
const { request } = e2e;
let otherWorkspaceToken = '';
const secrets: Secrets = {
  secretKey: SECRET_KEY,
  tokens: () =>
    [
      ...[NORA, NICK, SAM, ADA, RITA, DANA, NOBODY, PUBLISHER, 'wadmin@example.com'].map(token),
      otherWorkspaceToken,
      ...embedLinks,
    ].filter((t) => t.length > 0),
};
const expectRefused = (answer: Answer, status: number, code: string) =>
  expectRefusedWith(secrets, answer, status, code);

const appRun = async (email: string, path: string) =>
  asRun(
    await request('POST', `/api/w/${WS}/apps/clinics/run`, { token: token(email), body: { path } }),
  );

/** Runs twice: a miss (or a hit left by an earlier test) and then surely a hit, same rows. */
async function seesTwice(email: string, path: string, expected: unknown): Promise<void> {
  const first = await appRun(email, path);
  expect(first.status, first.text).toBe(200);
  expect(first.result).toEqual(expected);
  const second = await appRun(email, path);
  expectOk(second, true);
  expect(second.result).toEqual(expected);
  expect(second.resultBytes).toBe(first.resultBytes);
}

/** Refused the same way twice: a refusal is never cached. */
async function refusedTwice(send: () => Promise<Answer>, status: number, code: string) {
  for (let i = 0; i < 2; i++) expectRefused(await send(), status, code);
}

const perRecipient = (body: Record<string, unknown>, as = PUBLISHER) =>
  request('POST', `/api/w/${WS}/apps/clinics/runs/per-recipient`, { token: token(as), body });

interface OutboxItem {
  batch: string;
  runnable: string;
  fromCache: boolean;
  result?: unknown;
  error?: { code: string };
}
async function outboxOf(email: string): Promise<OutboxItem[]> {
  const answer = await request('GET', `/api/w/${WS}/outbox`, { token: token(email) });
  expect(answer.status, answer.text).toBe(200);
  return (answer.json as { items: OutboxItem[] }).items;
}
const inBatch = (items: OutboxItem[], batch: string) => items.filter((i) => i.batch === batch);

let sql: pg.Client;

beforeAll(async () => {
  await e2e.start();
  otherWorkspaceToken = (
    await e2e.cliJson<{ token: string }>(['-w', 'other', 'token', 'create', '--user', NORA])
  ).token;
  made[NOBODY] = (
    await e2e.cliJson<{ token: string }>(['token', 'create', '--user', NOBODY])
  ).token;
  await e2e.ready();
  sql = new pg.Client({ connectionString: e2e.env['DATABASE_URL'] });
  sql.on('error', () => {});
  await sql.connect();
});

afterAll(async () => {
  await sql?.end().catch(() => {});
  await e2e.stop();
});

describe('what each viewer sees, each row also on a cache hit', () => {
  it('a provider at North: only their own patients; counts of every North patient', async () => {
    await seesTwice(NORA, 'f/clinics/patients', NORAS);
    // The aggregate counts every patient of her entitled systems, not only her own.
    await seesTwice(NORA, 'f/clinics/counts', NORTH_COUNTS);
  });

  it("a second provider at North: only their own patients, never the first's", async () => {
    await seesTwice(NICK, 'f/clinics/patients', NICKS);
    // Same role, same login: the policy told them apart by the viewer's identity alone.
    expect((await appRun(NORA, 'f/clinics/patients')).result).toEqual(NORAS);
  });

  it('a provider at South: only South patients, never North', async () => {
    await seesTwice(SAM, 'f/clinics/patients', SAMS);
    await seesTwice(SAM, 'f/clinics/counts', SOUTH_COUNTS);
  });

  it('a North system administrator: per-clinic counts for North; patient detail refused with a code', async () => {
    await seesTwice(ADA, 'f/clinics/counts', NORTH_COUNTS);
    await refusedTwice(() => appRun(ADA, 'f/clinics/patients'), 403, 'E_ROLE_REQUIRED');
  });

  it('a provider who is also a system administrator: detail is her own patients only; counts of her systems', async () => {
    // Permissive policies add up: without narrowing, her detail would be every North patient.
    await seesTwice(DANA, 'f/clinics/patients', DANAS);
    await seesTwice(DANA, 'f/clinics/counts', NORTH_COUNTS);
  });

  it('someone with the role but no entitlement row: no rows', async () => {
    await seesTwice(RITA, 'f/clinics/patients', []);
    await seesTwice(RITA, 'f/clinics/counts', []);
  });

  it('a per-viewer embed link: rows matching its signed attributes; role checks see no roles', async () => {
    const key = await e2e.cliJson<{ kid: string; privateJwk: JWK }>(['embed-key', 'create']);
    const linkFor = (health_system: string) =>
      signEmbedAssertion(key.privateJwk, {
        workspace: WS,
        app: 'clinics',
        attributes: { health_system },
      });
    const embedRun = async (link: string, path: string) =>
      asRun(
        await request('POST', `/api/w/${WS}/embed/apps/clinics/run`, {
          token: link,
          body: { path },
        }),
      );
    const north = await linkFor('north');
    const south = await linkFor('south');
    embedLinks.push(north, south);
    embedViewers.push({ link: north, counts: NORTH_COUNTS }, { link: south, counts: SOUTH_COUNTS });
    for (const [link, expected] of [
      [north, NORTH_COUNTS],
      [south, SOUTH_COUNTS],
    ] as const) {
      // Counted by the counts view's embed branch, which reads the signed attribute.
      for (let i = 0; i < 2; i++) {
        const counts = await embedRun(link, 'f/clinics/counts');
        expectOk(counts, i === 1);
        expect(counts.result).toEqual(expected);
      }
      // An embed viewer holds no provider role: patient detail is refused before any query.
      for (let i = 0; i < 2; i++)
        expectRefused(await embedRun(link, 'f/clinics/patients'), 403, 'E_ROLE_REQUIRED');
    }
  });

  it('a public share link (anonymous): refused, nothing shown', async () => {
    for (const [path, code] of [
      ['f/clinics/patients', 'E_NO_VIEWER'],
      ['f/clinics/counts', 'E_NO_VIEWER'],
    ] as const) {
      await refusedTwice(
        () => request('POST', `/api/w/${WS}/public/apps/clinics-public/run`, { body: { path } }),
        403,
        code,
      );
    }
  });

  it("a schedule running as the app's creator: identity reads refused; nothing written to shared output", async () => {
    // The schedule ran once before the server said it was ready.
    const answer = await request('GET', `/api/w/${WS}/schedules`, { token: token(NORA) });
    expect(answer.status).toBe(200);
    const digest = (answer.json as { schedules: { name: string }[] }).schedules.find(
      (s) => s.name === 'clinics-digest',
    );
    // The status shared with every token holder is a code, never a row.
    expect(digest).toEqual({
      name: 'clinics-digest',
      path: 'f/clinics/digest',
      runs: 1,
      lastRunAt: expect.any(String),
      lastOutcome: 'E_NO_VIEWER',
    });
    // Nothing delivered to anyone by it, the creator included.
    for (const email of [PUBLISHER, NORA, ADA]) {
      const items = await outboxOf(email);
      expect(items.filter((item) => item.runnable === 'f/clinics/digest')).toEqual([]);
      if (email !== NORA) expect(items).toEqual([]);
    }
    // Identity is bound to viewer connections only: even a run that has a viewer cannot read it
    // on the data table's default role.
    await refusedTwice(
      () =>
        request('POST', `/api/w/${WS}/jobs/run`, {
          token: token(NORA),
          body: { path: 'f/clinics/digest' },
        }),
      403,
      'E_NO_VIEWER',
    );
  });

  it('a schedule that runs for each recipient: each provider their own rows, in their outbox', async () => {
    const answer = await request('GET', `/api/w/${WS}/schedules`, { token: token(ADA) });
    const perProvider = (
      answer.json as { schedules: { name: string; lastBatch?: { batch: string } }[] }
    ).schedules.find((s) => s.name === 'clinics-per-provider');
    // What every token holder sees of it: counts, never a row or a recipient.
    expect(perProvider).toEqual({
      name: 'clinics-per-provider',
      path: 'f/clinics/patients',
      runs: 1,
      lastRunAt: expect.any(String),
      lastOutcome: 'ok',
      lastBatch: {
        batch: expect.any(String),
        recipients: 5,
        delivered: 5,
        fromCache: 0,
        refused: {},
      },
    });
    const batch = perProvider!.lastBatch!.batch;
    for (const [email, rows] of [
      [NORA, NORAS],
      [NICK, NICKS],
      [SAM, SAMS],
      [RITA, []],
      [DANA, DANAS],
    ] as const) {
      expect(inBatch(await outboxOf(email), batch), email).toEqual([
        expect.objectContaining({ runnable: 'f/clinics/patients', result: rows }),
      ]);
    }
    expect(inBatch(await outboxOf(ADA), batch)).toEqual([]);
  });

  it('a job run for each recipient: each recipient their own rows, delivered to them only', async () => {
    const recipients = [NORA, NICK, SAM, ADA, RITA, NOBODY];
    const start = await perRecipient({ path: 'f/clinics/patients', recipients });
    expect(start.status, start.text).toBe(200);
    const summary = start.json as { batch: string; outcomes: string[] };
    expect(summary).toEqual({
      batch: expect.any(String),
      recipients: 6,
      delivered: 4,
      fromCache: expect.any(Number),
      refused: { E_ROLE_REQUIRED: 2 },
      outcomes: ['ok', 'ok', 'ok', 'E_ROLE_REQUIRED', 'ok', 'E_ROLE_REQUIRED'],
    });
    // The starter's answer holds no row and no identity.
    expect(start.text).not.toContain('P. ');
    expectNoSecretsIn(secrets, start.text, 'the batch summary');

    const expected: [string, OutboxItem['result'] | { code: string }][] = [
      [NORA, NORAS],
      [NICK, NICKS],
      [SAM, SAMS],
      [RITA, []],
      [ADA, { code: 'E_ROLE_REQUIRED' }],
      [NOBODY, { code: 'E_ROLE_REQUIRED' }],
    ];
    for (const [email, want] of expected) {
      const mine = inBatch(await outboxOf(email), summary.batch);
      expect(mine, email).toHaveLength(1);
      if (Array.isArray(want)) expect(mine[0]!.result, email).toEqual(want);
      else expect(mine[0]!.error, email).toEqual(want);
      expect(mine[0]!.runnable).toBe('f/clinics/patients');
    }

    // Again: every delivered result is now the recipient's own cache entry.
    const again = await perRecipient({ path: 'f/clinics/patients', recipients });
    const second = again.json as { batch: string; delivered: number; fromCache: number };
    expect(second).toMatchObject({ delivered: 4, fromCache: 4 });
    for (const [email, want] of expected.slice(0, 4)) {
      const [item] = inBatch(await outboxOf(email), second.batch);
      expect(item, email).toMatchObject({ fromCache: true, result: want });
    }
  });

  it("a per-recipient job for a group; one recipient's refusal does not stop the others", async () => {
    const byGroup = await perRecipient({ path: 'f/clinics/patients', group: 'providers' });
    expect(byGroup.status, byGroup.text).toBe(200);
    // Counts only: who is in the group is not the starter's to learn.
    expect(byGroup.json).toEqual({
      batch: expect.any(String),
      recipients: 5,
      delivered: 5,
      fromCache: expect.any(Number),
      refused: {},
    });
    const { batch } = byGroup.json as { batch: string };
    expect(inBatch(await outboxOf(SAM), batch)).toEqual([
      expect.objectContaining({ result: SAMS }),
    ]);
    expect(inBatch(await outboxOf(ADA), batch)).toEqual([]);

    // Counts narrow to the roles that may summarize: someone with none of them is refused
    // (E_ROLE_REQUIRED) while the others get theirs.
    const counts = await perRecipient({ path: 'f/clinics/counts', recipients: [NOBODY, ADA] });
    expect(counts.json).toMatchObject({ delivered: 1, outcomes: ['E_ROLE_REQUIRED', 'ok'] });
    const countsBatch = (counts.json as { batch: string }).batch;
    expect(inBatch(await outboxOf(ADA), countsBatch)).toEqual([
      expect.objectContaining({ result: NORTH_COUNTS }),
    ]);
    expect(inBatch(await outboxOf(NOBODY), countsBatch)).toEqual([
      expect.objectContaining({ error: { code: 'E_ROLE_REQUIRED' } }),
    ]);

    // A recipient named twice is run and delivered to once.
    const twice = await perRecipient({ path: 'f/clinics/counts', recipients: [SAM, ADA, SAM] });
    expect(twice.json).toMatchObject({ recipients: 2, delivered: 2, outcomes: ['ok', 'ok', 'ok'] });
    const twiceBatch = (twice.json as { batch: string }).batch;
    expect(inBatch(await outboxOf(SAM), twiceBatch)).toEqual([
      expect.objectContaining({ result: SOUTH_COUNTS }),
    ]);
  });

  it("an API key scoped to fewer roles than its owner: the key's roles only", async () => {
    // Olive holds both clinic roles and is entitled to North; she has no patients of her own.
    for (const group of ['providers', 'system_admins']) {
      const added = await e2e.cli(['groups', 'add', OLIVE, group]);
      expect(added.code, added.stderr).toBe(0);
    }
    await sql.query(`insert into clinics.entitlements values ($1, 'north')`, [OLIVE]);
    made[OLIVE] = (
      await e2e.cliJson<{ token: string }>(['token', 'create', '--user', OLIVE])
    ).token;
    const keyOf = async (role: string) =>
      (
        await e2e.cliJson<{ token: string }>([
          'token',
          'create',
          '--user',
          OLIVE,
          '--roles',
          `${prefix}${role}`,
        ])
      ).token;
    const adminKey = await keyOf('system_admin');
    const providerKey = await keyOf('provider');
    const runWith = async (key: string, path: string) =>
      asRun(await request('POST', `/api/w/${WS}/apps/clinics/run`, { token: key, body: { path } }));
    // The owner, with both roles, once the CLI's change has reached the server: detail is her
    // own patients (none: narrowed to the provider role), counts are every North patient.
    await pollUntil(async () => (await appRun(OLIVE, 'f/clinics/counts')).status === 200, 5000);
    await seesTwice(OLIVE, 'f/clinics/patients', []);
    await seesTwice(OLIVE, 'f/clinics/counts', NORTH_COUNTS);
    // The administrator-only key: counts yes, patient detail refused (it lacks the provider
    // role), and its answers never come from the owner's entries.
    for (let i = 0; i < 2; i++) {
      const counts = await runWith(adminKey, 'f/clinics/counts');
      expectOk(counts, i === 1);
      expect(counts.result).toEqual(NORTH_COUNTS);
      expectRefused(await runWith(adminKey, 'f/clinics/patients'), 403, 'E_ROLE_REQUIRED');
    }
    // The provider-only key: her own patients (none), and the counts a provider gets.
    for (let i = 0; i < 2; i++) {
      const own = await runWith(providerKey, 'f/clinics/patients');
      expectOk(own, i === 1);
      expect(own.result).toEqual([]);
      const counts = await runWith(providerKey, 'f/clinics/counts');
      expectOk(counts, i === 1);
      expect(counts.result).toEqual(NORTH_COUNTS);
    }
  });

  it("nobody reads another's outbox", async () => {
    const nicks = await outboxOf(NICK);
    expect(nicks.length).toBeGreaterThan(0);
    for (const item of nicks) if (item.result !== undefined) expect(item.result).toEqual(NICKS);
    // The route takes no recipient: a query naming one changes nothing.
    const asked = await request('GET', `/api/w/${WS}/outbox?recipient=${NORA}`, {
      token: token(NICK),
    });
    expect((asked.json as { items: OutboxItem[] }).items).toEqual(nicks);
    // Another workspace's token, and no token, are refused.
    expectRefused(
      await request('GET', `/api/w/${WS}/outbox`, { token: otherWorkspaceToken }),
      403,
      'E_FORBIDDEN',
    );
    expectRefused(await request('GET', `/api/w/${WS}/outbox`), 401, 'E_UNAUTHENTICATED');
    // Nor is a per-recipient run a way around the app: another workspace's token, an unknown
    // runnable, or both a list and a group are refused.
    expectRefused(
      await request('POST', `/api/w/${WS}/apps/clinics/runs/per-recipient`, {
        token: otherWorkspaceToken,
        body: { path: 'f/clinics/patients', recipients: [NORA] },
      }),
      403,
      'E_FORBIDDEN',
    );
    expectRefused(
      await perRecipient({ path: 'f/orders/list', recipients: [NORA] }),
      404,
      'E_UNKNOWN_RUNNABLE',
    );
    const both = await perRecipient({ path: 'f/clinics/patients', recipients: [NORA], group: 'x' });
    expect(both.status).toBe(400);
  });
});

// --- Python and DuckDB twins (issue 21): the same rows through the server, per viewer ---
describe('the Python and DuckDB twins, through the server, each row also on a cache hit', () => {
  const twins = (kind: 'py' | 'duckdb') => ({
    patients: `f/clinics/patients_${kind}`,
    counts: `f/clinics/counts_${kind}`,
  });
  it.each(['py', 'duckdb'] as const)(
    '%s: providers, a system administrator, no entitlement',
    async (kind) => {
      const { patients, counts } = twins(kind);
      await seesTwice(NORA, patients, NORAS);
      await seesTwice(NORA, counts, NORTH_COUNTS);
      await seesTwice(SAM, patients, SAMS);
      await seesTwice(DANA, patients, DANAS);
      await seesTwice(ADA, counts, NORTH_COUNTS);
      await refusedTwice(() => appRun(ADA, patients), 403, 'E_ROLE_REQUIRED');
      await seesTwice(RITA, patients, []);
      await refusedTwice(
        () =>
          request('POST', `/api/w/${WS}/public/apps/clinics-public/run`, {
            body: { path: counts },
          }),
        403,
        'E_NO_VIEWER',
      );
    },
  );
  it.each(['py', 'duckdb'] as const)(
    '%s: per-viewer embed links see their signed counts; patient detail refused',
    async (kind) => {
      const { patients, counts } = twins(kind);
      // The embed row above signed these links; without it this test has nothing to check.
      expect(embedViewers).toHaveLength(2);
      const embedRun = async (link: string, path: string) =>
        asRun(
          await request('POST', `/api/w/${WS}/embed/apps/clinics/run`, {
            token: link,
            body: { path },
          }),
        );
      for (const { link, counts: expected } of embedViewers) {
        for (let i = 0; i < 2; i++) {
          const answer = await embedRun(link, counts);
          expectOk(answer, i === 1);
          expect(answer.result).toEqual(expected);
        }
        await refusedTwice(() => embedRun(link, patients), 403, 'E_ROLE_REQUIRED');
      }
    },
  );
});
// --- end of the twins ---

describe("who may fan out: the app's publisher or a workspace admin, nobody else", () => {
  const WADMIN = 'wadmin@example.com'; // a workspace admin who did not publish the app

  it('anyone else is refused with 403 E_FANOUT_FORBIDDEN before the request is looked at', async () => {
    // Whatever the body — a real batch, a malformed one, an unknown runnable or group, too many
    // recipients — the same answer, byte for byte: nothing about the list, or who may see what.
    const bodies: Record<string, unknown>[] = [
      { path: 'f/clinics/patients', recipients: [NORA, ADA, NOBODY] },
      { path: 'f/clinics/patients', group: 'providers' },
      { path: 'f/clinics/patients', group: 'no-such-group' },
      { path: 'f/orders/list', recipients: [NORA] },
      { path: 'f/clinics/patients', recipients: [NORA], group: 'x' },
      { path: 'f/clinics/patients', recipients: Array.from({ length: 1001 }, (_, i) => `u${i}@x`) },
      { path: 1 },
      {},
    ];
    const delivered = async () =>
      (await sql.query<{ n: number }>('select count(*)::int as n from viewer_cache_server.outbox'))
        .rows[0]!.n;
    const before = await delivered();
    const texts = new Set<string>();
    for (const email of [NORA, ADA, NOBODY]) {
      for (const body of bodies) {
        const answer = await perRecipient(body, email);
        expectRefused(answer, 403, 'E_FANOUT_FORBIDDEN');
        texts.add(answer.text);
      }
    }
    expect(texts.size).toBe(1);
    // Nothing ran and nothing was delivered.
    expect(await delivered()).toBe(before);
    // A token of another workspace is still told only that (as for every route).
    expectRefused(
      await request('POST', `/api/w/${WS}/apps/clinics/runs/per-recipient`, {
        token: otherWorkspaceToken,
        body: {},
      }),
      403,
      'E_FORBIDDEN',
    );
  });

  it('a workspace admin who did not publish the app may', async () => {
    // Made a workspace admin with the library, as an operator's own tooling would.
    const datatables = await createDatatables({
      connection: e2e.env['DATABASE_URL']!,
      secretKey: SECRET_KEY,
      migrate: false,
      catalog: { awaitPropagation: true },
    });
    try {
      await datatables.admin.addMembership(WS, WADMIN, 'admin', 'workspace');
    } finally {
      await datatables.close();
    }
    made[WADMIN] = (
      await e2e.cliJson<{ token: string }>(['token', 'create', '--user', WADMIN])
    ).token;
    const answer = await perRecipient({ path: 'f/clinics/counts', recipients: [ADA] }, WADMIN);
    expect(answer.status, answer.text).toBe(200);
    expect(answer.json).toMatchObject({ recipients: 1, delivered: 1, outcomes: ['ok'] });
    // Its runs ran as the app's publisher, for the recipient: Ada's own counts.
    const batch = (answer.json as { batch: string }).batch;
    expect(inBatch(await outboxOf(ADA), batch)).toEqual([
      expect.objectContaining({ result: NORTH_COUNTS }),
    ]);
  });
});

describe('a runnable that starts a child in process, wherever misses run', () => {
  it('the orders summary (a child job beside its parent) for a viewer of two roles: a hit on its repeat', async () => {
    const CAROL = 'carol@example.com'; // the orders demo's emea and amer
    const summary = () =>
      e2e
        .request('POST', `/api/w/${WS}/apps/orders-dashboard/run`, {
          token: token(CAROL),
          body: { path: 'f/orders/summary' },
        })
        .then(asRun);
    const first = await summary();
    expect(first.status, first.text).toBe(200);
    expect(Object.keys((first.result as { totals: object }).totals).sort()).toEqual([
      'amer',
      'emea',
    ]);
    const second = await summary();
    expectOk(second, true);
    expect(second.resultBytes).toBe(first.resultBytes);
  });
});

describe('revoking access (the guide\'s "Revoking access"), on the next run', () => {
  it('role removed: the next run is refused', async () => {
    await seesTwice(NICK, 'f/clinics/patients', NICKS);
    const removed = await e2e.cli(['groups', 'remove', NICK, 'providers']);
    expect(removed.code, removed.stderr).toBe(0);
    // The CLI's change has committed: the server's next run for Nick no longer holds the role.
    await pollUntil(async () => (await appRun(NICK, 'f/clinics/patients')).status === 403, 5000);
    await refusedTwice(() => appRun(NICK, 'f/clinics/patients'), 403, 'E_ROLE_REQUIRED');
    expect((await appRun(NORA, 'f/clinics/patients')).result).toEqual(NORAS);
  });

  it('entitlement row deleted: the next run shows no rows for that system', async () => {
    await seesTwice(SAM, 'f/clinics/patients', SAMS);
    await seesTwice(NORA, 'f/clinics/patients', NORAS);
    // Anyone, through any connection: the entitlements table is a governing table.
    await sql.query(`delete from clinics.entitlements where email = $1`, [SAM]);
    // The first run that is not served from Sam's old entry: how soon is measured, not assumed.
    let next: RunAnswer | undefined;
    await pollUntil(async () => {
      const answer = await appRun(SAM, 'f/clinics/patients');
      if (answer.fromCache !== false) return false;
      next = answer;
      return true;
    }, 5000);
    expectOk(next!, false);
    expect(next!.result).toEqual([]);
    // Others keep their rows, and their entries: the change answered only Sam's questions.
    const nora = await appRun(NORA, 'f/clinics/patients');
    expectOk(nora, true);
    expect(nora.result).toEqual(NORAS);
  });
});

describe('logs', () => {
  it('the server logged the batches by counts: never a recipient, a token or a row', async () => {
    e2e.server.signal('SIGINT');
    expect((await e2e.server.closed).code, e2e.server.stderr).toBe(0);
    const batches = e2e.server.lines.filter((line) => line.includes('per-recipient batch done'));
    // The schedule's, and the six started by the tests above.
    expect(batches).toHaveLength(7);
    for (const line of e2e.server.lines) {
      expectNoSecretsIn(secrets, line, 'a log line');
      expect(line).not.toContain('P. ');
    }
  });
});
