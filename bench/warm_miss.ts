/**
 * The warm-miss rows alone (`npx tsx bench/warm_miss.ts [--rounds N]`), with DATABASE_URL (else
 * an embedded PostgreSQL): what connecting as the viewer adds to the runnable's own query, with
 * and without the viewer's identity bound and the post-release login check, in about 20 s
 * instead of the full run's data-table section. With `VC_BASE_SRC=/path/to/other/src`, that
 * build's one- and two-role rows join the same rounds (`_base`), so a change to the miss path is
 * compared under the same noise (e.g. `git archive <commit> src | tar -x -C /tmp/base`).
 */
import { parseArgs } from 'node:util';
import { warmMissBench } from './datatable_bench.js';
import { benchPostgres } from './postgres_fixture.js';

const { values } = parseArgs({ options: { rounds: { type: 'string', default: '40' } } });
const rounds = Number(values.rounds);
if (!Number.isInteger(rounds) || rounds < 1) throw new Error('--rounds takes a positive integer');

const baseSrc = process.env['VC_BASE_SRC'];
const base =
  baseSrc === undefined
    ? undefined
    : ((await import(
        `${baseSrc.replace(/\/$/, '')}/index.ts`
      )) as typeof import('../src/index.js'));

const prefix = `vcw${process.pid}_`;
const postgres = await benchPostgres();
try {
  const rows = await warmMissBench(
    postgres,
    prefix,
    {
      warmupMs: 500,
      rounds,
      roundMs: 40,
      minOpsPerRound: 10,
      quiet: { maxOther: 1 },
    },
    base,
  );
  for (const row of rows) {
    const added = row.vsBaseline.value;
    const vs = row.id === row.baseline ? 'baseline' : `+${added.toFixed(1)} µs`;
    const us = (n: number) => `${n.toFixed(1).padStart(7)} µs`;
    console.log(`${row.id.padEnd(38)} p50 ${us(row.p50Us)}  p99 ${us(row.p99Us)}  ${vs}`);
  }
} finally {
  await postgres.close(prefix);
}
