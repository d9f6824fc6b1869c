import { describe, expect, it } from 'vitest';
import { judge, type ObservedRunnable } from '../../src/server/audit/audit_checks.js';
import type { RunOutcome } from '../../src/server/audit/run_outcome.js';
import type { ResolvedViewer } from '../../src/server/audit/viewer_set.js';

// The audit's judgement on outcomes given outright: a key two viewers with different answers
// share is a failure on both cells, whatever each was served; distinct keys pass.

const viewers: ResolvedViewer[] = [
  { viewer: { kind: 'user', email: 'nora@example.com' }, roles: ['clinics.provider'] },
  { viewer: { kind: 'user', email: 'sam@example.com' }, roles: ['clinics.provider'] },
  { viewer: { kind: 'anonymous' }, roles: [] },
];
const rows = (...ids: number[]): RunOutcome => ({
  value: ids.map((id) => ({ id })),
  fromCache: false,
});
const hit = (o: RunOutcome): RunOutcome => ({ ...o, fromCache: true });
const refused: RunOutcome = { code: 'E_NO_VIEWER' };

function observed(keys: (string | null)[], over: Partial<ObservedRunnable> = {}): ObservedRunnable {
  const fresh = [rows(1, 2), rows(5), refused];
  return {
    path: 'f/clinics/patients',
    spec: {},
    inPrivateApp: true,
    cached: true,
    datatables: ['clinics'],
    notAsViewer: [],
    fresh,
    first: fresh,
    second: fresh.map((o) => ('code' in o ? o : hit(o))),
    reverse: fresh,
    recipient: [null, null, null],
    keys,
    ...over,
  };
}

describe('audit judgement', () => {
  it('passes distinct keys', () => {
    const { cells, findings } = judge(viewers, [observed(['k1', 'k2', null])]);
    expect(findings).toEqual([]);
    expect(cells.map((c) => [c.viewer, c.status, c.cache])).toEqual([
      ['nora@example.com', 'pass', 'hit'],
      ['sam@example.com', 'pass', 'hit'],
      ['(anonymous)', 'pass', 'uncached'],
    ]);
  });

  it('fails two viewers with different answers sharing one key, whatever the order', () => {
    const { cells, findings } = judge(viewers, [observed(['k1', 'k1', null])]);
    expect(findings.map((f) => [f.check, f.status])).toEqual([['key-separation', 'fail']]);
    expect(cells.filter((c) => c.status === 'fail').map((c) => c.reasons)).toEqual([
      ['key shared with sam@example.com'],
      ['key shared with nora@example.com'],
    ]);
  });

  it('fails a nobody viewer answered with a row only some viewers are entitled to', () => {
    const fresh = [rows(1, 2), rows(5), rows(5)];
    const { findings } = judge(viewers, [
      observed(['k1', 'k2', 'k3'], { fresh, first: fresh, reverse: fresh, second: fresh }),
    ]);
    expect(findings.map((f) => [f.check, f.message])).toContainEqual([
      'no-viewer-no-rows',
      '(anonymous) gets 1 row(s) only some viewers are entitled to',
    ]);
  });

  it('fails a nobody viewer the cache serves an entitled row, though its own run is refused', () => {
    // Its own run is refused; the reverse pass served it nora's row 1.
    const { findings } = judge(viewers, [
      observed(['k1', 'k2', 'k3'], { reverse: [rows(1, 2), rows(5), rows(1)] }),
    ]);
    expect(findings.map((f) => f.check)).toContain('no-viewer-no-rows');
  });

  it('fails a recipient a per-recipient batch delivers another answer than their own', () => {
    const { cells, findings } = judge(viewers, [
      observed(['k1', 'k2', null], { recipient: [rows(1, 2), rows(1, 2), null] }),
    ]);
    expect(findings.map((f) => [f.check, f.runnable])).toEqual([
      ['per-recipient', 'f/clinics/patients'],
    ]);
    expect(findings[0]!.message).toMatch(
      /^sam@example\.com is delivered 2 rows .* by a per-recipient batch/,
    );
    expect(cells.map((c) => c.status)).toEqual(['pass', 'fail', 'pass']);
    expect(cells[0]!.reasons).toEqual([
      'served = own fresh run, in both orders and as a recipient',
    ]);
  });

  it('warns when every signed-in viewer gets the same answer from a private app', () => {
    const same = [rows(1), rows(1), refused];
    const { findings } = judge(viewers, [
      observed(['k1', 'k2', null], { fresh: same, first: same, reverse: same, second: same }),
    ]);
    expect(findings.map((f) => [f.check, f.status])).toEqual([['varies-by-viewer', 'warn']]);
  });
});
