/**
 * The audit's judgement, from what its runs gave (audit_runner.ts runs them): per (runnable,
 * viewer), differential isolation, the second request a hit, no viewer no rows, what a
 * per-recipient batch delivers and the declared expectations; per runnable, key separation and
 * whether it varies by viewer. Pure: no run, no connection.
 */
import { createHash } from 'node:crypto';
import stringify from 'fast-json-stable-stringify';
import type { AuditedRunnable } from '../apps/audit_definition.js';
import { type AuditCell, type AuditFinding, type AuditStatus, worse } from './audit_report.js';
import { canonical, type RunOutcome, rowsOf, sameOutcome } from './run_outcome.js';
import { isNoViewer, type ResolvedViewer, viewerLabel } from './viewer_set.js';

/** What the audit saw of one runnable. */
export interface ObservedRunnable {
  readonly path: string;
  readonly spec: AuditedRunnable;
  /** Whether some app listing it is not public (its viewers sign in). */
  readonly inPrivateApp: boolean;
  /** Whether results of it are cached at all (a TTL). */
  readonly cached: boolean;
  /** Data tables it read, and those it read other than as the viewer (`main?as=default`). */
  readonly datatables: readonly string[];
  readonly notAsViewer: readonly string[];
  /** Per viewer (same order as the viewers): fresh process, cached twice, cached in reverse. */
  readonly fresh: readonly RunOutcome[];
  readonly first: readonly RunOutcome[];
  readonly second: readonly RunOutcome[];
  readonly reverse: readonly RunOutcome[];
  /**
   * Per viewer: what a per-recipient batch delivered them (origin `recipient`, the recipients
   * run concurrently through a cache of the audit's own), null for a viewer who is no recipient
   * (nobody, an embed viewer, a scoped key).
   */
  readonly recipient: readonly (RunOutcome | null)[];
  /** The cache key each viewer's run had (null when refused before one was built). */
  readonly keys: readonly (string | null)[];
}

/** Judges every cell and runnable. */
export function judge(
  viewers: readonly ResolvedViewer[],
  runnables: readonly ObservedRunnable[],
): { cells: AuditCell[]; findings: AuditFinding[] } {
  const cells: AuditCell[] = [];
  const findings: AuditFinding[] = [];
  for (const r of runnables) {
    const entitled = entitledRows(viewers, r.fresh);
    const extra = new Map<number, { status: AuditStatus; reason: string }[]>();
    const note = (i: number, status: AuditStatus, reason: string) =>
      extra.set(i, [...(extra.get(i) ?? []), { status, reason }]);

    // Key separation: viewers whose own answers differ never share an entry.
    for (let i = 0; i < viewers.length; i++)
      for (let j = i + 1; j < viewers.length; j++) {
        const [a, b] = [r.fresh[i]!, r.fresh[j]!];
        if ('code' in a || 'code' in b || sameOutcome(a, b)) continue;
        if (r.keys[i] !== null && r.keys[i] === r.keys[j]) {
          const message = `${viewerLabel(viewers[i]!.viewer)} and ${viewerLabel(viewers[j]!.viewer)} get different answers but share one cache entry`;
          findings.push({ check: 'key-separation', runnable: r.path, status: 'fail', message });
          note(i, 'fail', `key shared with ${viewerLabel(viewers[j]!.viewer)}`);
          note(j, 'fail', `key shared with ${viewerLabel(viewers[i]!.viewer)}`);
        }
      }

    // Varies by viewer: a private app's runnable reads as the viewer, and answers per viewer.
    if (r.inPrivateApp && r.datatables.length > 0 && r.spec.sameForEveryone !== true) {
      if (r.notAsViewer.length > 0)
        findings.push({
          check: 'varies-by-viewer',
          runnable: r.path,
          status: 'fail',
          message: `reads ${r.notAsViewer.join(', ')} not as the viewer: every viewer of the app gets the rows of that role (ask for datatable://NAME?as=viewer)`,
        });
      const answers = viewers
        .map((v, i) => ({ v, o: r.fresh[i]! }))
        .filter(({ v, o }) => v.viewer.kind === 'user' && !('code' in o));
      const distinct = new Set(answers.map(({ o }) => canonical(o)));
      if (answers.length >= 2 && distinct.size === 1 && rowsOf(answers[0]!.o).length > 0)
        findings.push({
          check: 'varies-by-viewer',
          runnable: r.path,
          status: 'warn',
          message: `every signed-in viewer gets the same answer: does it read as the viewer? (mark it sameForEveryone if it is meant to)`,
        });
    }

    for (const [i, resolved] of viewers.entries()) {
      const { viewer } = resolved;
      const fresh = r.fresh[i]!;
      const served = [r.first[i]!, r.second[i]!, r.reverse[i]!];
      let status: AuditStatus = 'pass';
      const reasons: string[] = [];
      const fail = (s: AuditStatus, reason: string) => {
        status = worse(status, s);
        reasons.push(reason);
      };
      // Differential isolation: served through the cache = own run in a fresh process.
      const differs = served.findIndex((s) => !sameOutcome(s, fresh));
      if (differs >= 0) {
        const which = ['first request', 'second request', 'reverse order'][differs];
        fail(
          'fail',
          `served (${which}) ${describe(served[differs]!)}, own fresh run ${describe(fresh)}`,
        );
        findings.push({
          check: 'differential-isolation',
          runnable: r.path,
          status: 'fail',
          message: `${viewerLabel(viewer)} is served ${describe(served[differs]!)} (${which}) but its own run in a fresh process gives ${describe(fresh)}`,
        });
      }
      const second = r.second[i]!;
      const cache: AuditCell['cache'] =
        'code' in second || !r.cached ? 'uncached' : second.fromCache ? 'hit' : 'miss';
      if (cache === 'miss') fail('warn', 'the second request was not a hit');

      // No viewer, no rows: refused, or an answer carrying no row some viewer is entitled to.
      // Both its own run and what the cache served it (a schedule's output is what it is served).
      const answered = [fresh, ...served].filter((o) => !('code' in o));
      if (isNoViewer(viewer) && answered.length > 0) {
        const rows = new Set(answered.flatMap(rowsOf).map((row) => stringify(row)));
        const leaked = [...rows].filter((row) => entitled.has(row)).length;
        if (leaked > 0) {
          const message = `${viewerLabel(viewer)} gets ${leaked} row(s) only some viewers are entitled to`;
          fail('fail', message);
          findings.push({ check: 'no-viewer-no-rows', runnable: r.path, status: 'fail', message });
        } else reasons.push('answered without a viewer, no entitled row');
      }

      // Per-recipient: a batch delivers each recipient exactly their own answer.
      const delivered = r.recipient[i] ?? null;
      if (delivered !== null && !sameOutcome(delivered, fresh)) {
        const message = `${viewerLabel(viewer)} is delivered ${describe(delivered)} by a per-recipient batch but its own run in a fresh process gives ${describe(fresh)}`;
        fail(
          'fail',
          `per-recipient batch delivered ${describe(delivered)}, own fresh run ${describe(fresh)}`,
        );
        findings.push({ check: 'per-recipient', runnable: r.path, status: 'fail', message });
      }

      // Declared expectations.
      const columns = r.spec.expect?.noColumns ?? [];
      if (columns.length > 0) {
        const seen = new Set(
          rowsOf(fresh)
            .concat(...served.map(rowsOf))
            .flatMap((row) => (row !== null && typeof row === 'object' ? Object.keys(row) : []))
            .filter((column) => columns.includes(column)),
        );
        if (seen.size > 0) {
          const message = `${viewerLabel(viewer)} gets column(s) ${[...seen].join(', ')} the runnable declares it never returns`;
          fail('fail', message);
          findings.push({ check: 'expectation', runnable: r.path, status: 'fail', message });
        }
      }
      if (r.spec.expect?.refusedWithoutRole === true && !isNoViewer(viewer)) {
        const holds = resolved.roles.some((role) =>
          r.datatables.some((d) => role.startsWith(`${d}.`)),
        );
        if (!holds && !('code' in fresh)) {
          const message = `${viewerLabel(viewer)} holds no role in ${r.datatables.join(', ') || 'its data tables'} but is answered`;
          fail('fail', message);
          findings.push({ check: 'expectation', runnable: r.path, status: 'fail', message });
        }
      }
      for (const e of extra.get(i) ?? []) fail(e.status, e.reason);
      if (reasons.length === 0)
        reasons.push(
          'code' in fresh
            ? `refused (${fresh.code}), as in a fresh process`
            : r.recipient[i]
              ? 'served = own fresh run, in both orders and as a recipient'
              : 'served = own fresh run, in both orders',
        );
      cells.push({
        runnable: r.path,
        viewer: viewerLabel(viewer),
        status,
        rows: 'code' in fresh ? null : rowsOf(fresh).length,
        ...('code' in fresh ? { code: fresh.code } : {}),
        cache,
        reasons,
      });
    }
  }
  return { cells, findings };
}

/**
 * Rows some signed-in viewer's own answer holds and not every signed-in viewer's (a refused
 * viewer holds none): what must never reach a place without a viewer.
 */
function entitledRows(viewers: readonly ResolvedViewer[], fresh: readonly RunOutcome[]) {
  const signedIn = viewers.flatMap((v, i) => (isNoViewer(v.viewer) ? [] : [fresh[i]!]));
  const sets = signedIn.map((o) => new Set(rowsOf(o).map((row) => stringify(row))));
  const everyone = new Set([...(sets[0] ?? [])].filter((row) => sets.every((s) => s.has(row))));
  const entitled = new Set<string>();
  for (const set of sets) for (const row of set) if (!everyone.has(row)) entitled.add(row);
  return entitled;
}

function describe(outcome: RunOutcome): string {
  if ('code' in outcome) return `a refusal (${outcome.code})`;
  const rows = rowsOf(outcome).length;
  // Row counts only (a report names no row); a fingerprint tells two equal counts apart.
  const digest = createHash('sha256').update(canonical(outcome)).digest('hex').slice(0, 8);
  return `${rows} row${rows === 1 ? '' : 's'} (answer ${digest})`;
}
