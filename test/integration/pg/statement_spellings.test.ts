import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { asAdmin } from '../../helpers/pg.js';
import { roleChangeSpelling } from '../../helpers/sql_spellings.js';

// The generated corpus the query proxy's allowlist is tested with (test/unit/
// statement_allowlist.test.ts) is made of spellings Postgres itself reads: none of them is a
// syntax error to the server under test, so each refusal there refuses something that would run.

describe('the role-change corpus is real SQL', () => {
  it('Postgres reads every sampled spelling without a syntax error (600 spellings)', async () => {
    const spellings = fc.sample(roleChangeSpelling(), { numRuns: 600, seed: 33 });
    const syntaxErrors = await asAdmin('postgres', async (client) => {
      const found: string[] = [];
      for (const sql of spellings) {
        // In a transaction rolled back: nothing a spelling sets outlives it (and the roles and
        // prepared statements it names do not exist, so most end in an error that is not 42601).
        await client.query('begin');
        const code = await client.query(sql).then(
          () => null,
          (err: { code?: string }) => err.code ?? 'none',
        );
        await client.query('rollback');
        if (code === '42601') found.push(sql);
      }
      return found;
    });
    expect(syntaxErrors).toEqual([]);
  });
});
