/**
 * A transaction through the query proxy vs the same statements one by one (issue 33, item 7):
 * `npx tsx bench/proxy_transaction.ts [rounds]`. Both as the same viewer, through
 * `ProxyTransactions.run` in this process (no HTTP: what the proxy itself costs), on a fresh
 * database of DATABASE_URL (or an embedded PostgreSQL). A "job" is 5 inserts and 1 select:
 * one by one, each statement is a lease of its own (bounds set, statement, reset on release);
 * in a transaction, BEGIN leases once and COMMIT releases once. Interleaved rounds; p50 and p90
 * per job, and the ratio of the p50s.
 */
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import {
  AGENT_PROTOCOL_VERSION,
  createDatatables,
  createExecutor,
  DATATABLE_VIEWER_ROLE,
  ProxyTransactions,
} from '../src/index.js';
import { benchPostgres } from './postgres_fixture.js';

const rounds = Number(process.argv[2] ?? 30);
const perRound = 20;
const prefix = `vcb_tx_${randomBytes(3).toString('hex')}_`;
const WS = 'bench';
const pgs = await benchPostgres();
const database = `${prefix}db`;
await pgs.createDatabase(database);
const admin = new pg.Pool({ connectionString: pgs.url(database), max: 1 });
const datatables = await createDatatables({
  connection: pgs.url(database),
  secretKey: randomBytes(32).toString('hex'),
  pools: { prepareAhead: false },
});
try {
  await datatables.admin.createDatatable(WS, 'main', { database });
  const role = `${prefix}writer`;
  await datatables.admin.createRole(WS, 'main', role, { tenants: ['group:writers'] });
  const { generation } = await datatables.admin.addMembership(
    WS,
    'alice@example.com',
    'group',
    'writers',
  );
  await datatables.waitForGeneration(generation);
  await admin.query('create table notes (id bigint primary key, who text)');
  await admin.query(`grant select, insert on notes to ${role}`);

  const executor = createExecutor({ runnables: { noop: { fn: async () => null } } });
  const job = executor.createJob({
    workspace: WS,
    path: 'noop',
    runAs: 'publisher@example.com',
    origin: { kind: 'app', session: { email: 'alice@example.com' } },
  });
  const jobs = { jobOfToken: () => job };
  const proxy = new ProxyTransactions({ connector: datatables });
  let next = 1;
  const ask = (sql: string, tx: string | null, params: unknown[] = []) =>
    proxy.run(
      {
        protocol: AGENT_PROTOCOL_VERSION,
        jobToken: 'vcj_bench',
        reference: { datatable: 'main', role: DATATABLE_VIEWER_ROLE },
        sql,
        params,
        transaction: tx,
      },
      jobs,
    );
  const INSERT = 'insert into notes values ($1, viewer_cache.viewer_email())';
  const SELECT = 'select count(*)::int as n from notes';
  const oneByOne = async () => {
    for (let i = 0; i < 5; i++) await ask(INSERT, null, [next++]);
    await ask(SELECT, null);
  };
  const inTransaction = async () => {
    const tx = (await ask('begin', null)).transaction!;
    for (let i = 0; i < 5; i++) await ask(INSERT, tx, [next++]);
    await ask(SELECT, tx);
    await ask('commit', tx);
  };
  const scenarios = {
    'one by one (6 leases)': oneByOne,
    'BEGIN … COMMIT (1 lease)': inTransaction,
  };
  const times = new Map<string, number[]>(Object.keys(scenarios).map((k) => [k, []]));
  for (let w = 0; w < 5; w++) for (const fn of Object.values(scenarios)) await fn();
  for (let r = 0; r < rounds; r++) {
    for (const [name, fn] of Object.entries(scenarios)) {
      for (let i = 0; i < perRound; i++) {
        const t0 = process.hrtime.bigint();
        await fn();
        times.get(name)!.push(Number(process.hrtime.bigint() - t0) / 1e6);
      }
    }
  }
  const pct = (xs: number[], p: number) =>
    [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) * p)]!;
  const base = pct(times.get('one by one (6 leases)')!, 0.5);
  console.log(`PostgreSQL ${pgs.version}; ${rounds} rounds × ${perRound} jobs each, interleaved`);
  console.log('| job of 5 inserts + 1 select | p50 ms | p90 ms | p50 ratio |');
  console.log('|---|---|---|---|');
  for (const [name, xs] of times) {
    console.log(
      `| ${name} | ${pct(xs, 0.5).toFixed(2)} | ${pct(xs, 0.9).toFixed(2)} | ${(pct(xs, 0.5) / base).toFixed(2)} |`,
    );
  }
  await proxy.close();
} finally {
  await datatables.close();
  await admin.end();
  await pgs.close(prefix);
}
