/**
 * The audit's report for people and for CI: a summary table for a terminal, JUnit XML (one test
 * case per cell, per runnable finding and per lint), and one self-contained HTML page with the
 * viewer × runnable matrix and the lints (no script, no external resource).
 */
import type { PolicyFinding } from '../../index.js';
import type { AuditCell, AuditFinding, AuditReport } from './audit_report.js';

/** The summary a terminal shows: one line per runnable, then what failed or warned. */
export function renderSummary(report: AuditReport): string {
  const lines: string[] = [];
  const { summary } = report;
  lines.push(
    `viewer-cache audit of ${report.apps} (workspace ${report.workspace}): ${report.viewers.length} viewers × ${report.runnables.length} runnables in ${(report.durationMs / 1000).toFixed(1)} s${executedBy(report)}`,
  );
  lines.push('');
  const rows = report.runnables.map((r) => {
    const cells = report.cells.filter((c) => c.runnable === r.path);
    const count = (s: string) => cells.filter((c) => c.status === s).length;
    const runnableFindings = report.findings.filter(
      (f) => f.runnable === r.path && f.check === 'varies-by-viewer',
    );
    const status = [
      count('fail') > 0 || runnableFindings.some((f) => f.status === 'fail') ? 'FAIL' : '',
    ][0];
    const verdict =
      status ||
      (count('warn') > 0 || runnableFindings.some((f) => f.status === 'warn') ? 'warn' : 'pass');
    return [verdict, r.path, String(count('pass')), String(count('warn')), String(count('fail'))];
  });
  lines.push(...columns([['', 'runnable', 'pass', 'warn', 'fail'], ...rows]));
  const problems = [
    ...report.findings.filter((f) => f.status !== 'pass').map(findingLine),
    ...report.lints.map(lintLine),
  ];
  if (problems.length > 0) lines.push('', ...problems);
  lines.push(
    '',
    `${report.status.toUpperCase()}: ${summary.pass} passed, ${summary.warn} warned, ${summary.fail} failed, ${summary.intended} lint(s) marked intended`,
  );
  return lines.join('\n');
}

/** How the cached runs ran, when not in process. */
function executedBy(report: AuditReport): string {
  return report.execution === 'queue'
    ? `, cached runs through a queue (${report.workerJobs ?? 0} jobs on its worker)`
    : '';
}

function findingLine(f: AuditFinding): string {
  return `${f.status === 'fail' ? 'FAIL' : 'warn'} ${f.check} ${f.runnable}: ${f.message}`;
}

function lintLine(l: PolicyFinding): string {
  return l.status === 'intended'
    ? `intended ${l.lint} ${l.object} (${l.datatable}): ${l.intended}`
    : `FAIL ${l.lint} ${l.object} (${l.datatable}): ${l.message}. Fix: ${l.fix}`;
}

function columns(rows: string[][]): string[] {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((row) => row[i]!.length)));
  return rows.map((row) =>
    row
      .map((cell, i) => cell.padEnd(widths[i]!))
      .join('  ')
      .trimEnd(),
  );
}

/** JUnit XML: suites per runnable (its cells and findings) and one for the lints. */
export function renderJunit(report: AuditReport): string {
  const suites: string[] = [];
  for (const r of report.runnables) {
    const cases = report.cells
      .filter((c) => c.runnable === r.path)
      .map((c) => testCase(r.path, c.viewer, c.status, c.reasons.join('; ')));
    for (const f of report.findings.filter(
      (x) => x.runnable === r.path && x.check === 'varies-by-viewer',
    ))
      cases.push(testCase(r.path, f.check, f.status, f.message));
    suites.push(suite(r.path, cases));
  }
  suites.push(
    suite(
      'policy lints',
      report.lints.map((l) =>
        testCase(
          `lints.${l.datatable}`,
          `${l.lint} ${l.object}`,
          l.status === 'fail' ? 'fail' : 'pass',
          l.status === 'fail' ? `${l.message}. Fix: ${l.fix}` : `intended: ${l.intended}`,
        ),
      ),
    ),
  );
  return `<?xml version="1.0" encoding="UTF-8"?>\n<testsuites name="viewer-cache audit" time="${(report.durationMs / 1000).toFixed(3)}">\n${suites.join('\n')}\n</testsuites>\n`;
}

function suite(name: string, cases: string[]): string {
  const failures = cases.filter((c) => c.includes('<failure')).length;
  return `  <testsuite name="${xml(name)}" tests="${cases.length}" failures="${failures}">\n${cases.join('\n')}\n  </testsuite>`;
}

function testCase(classname: string, name: string, status: string, text: string): string {
  const open = `    <testcase classname="${xml(classname)}" name="${xml(name)}"`;
  if (status === 'fail')
    return `${open}>\n      <failure message="${xml(text)}">${xml(text)}</failure>\n    </testcase>`;
  if (status === 'warn')
    return `${open}>\n      <system-out>${xml(`warning: ${text}`)}</system-out>\n    </testcase>`;
  return `${open}/>`;
}

function xml(text: string): string {
  return text
    .replace(/&/g, '&amp;')
    .replace(/</g, '&lt;')
    .replace(/>/g, '&gt;')
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&apos;');
}

/** One self-contained HTML page: the matrix (viewers down, runnables across) and the lints. */
export function renderHtml(report: AuditReport): string {
  const byKey = new Map(report.cells.map((c) => [`${c.runnable}\u0000${c.viewer}`, c]));
  const head = report.runnables
    .map((r) => `<th scope="col" title="${xml(r.reads.join(' '))}">${xml(r.path)}</th>`)
    .join('');
  const body = report.viewers
    .map((v) => {
      const cells = report.runnables
        .map((r) => cellHtml(byKey.get(`${r.path}\u0000${v.label}`)))
        .join('');
      return `<tr><th scope="row">${xml(v.label)}<small>${xml(v.roles.join(', ') || 'no role')}</small></th>${cells}</tr>`;
    })
    .join('\n');
  const findings = report.findings
    .filter((f) => f.status !== 'pass')
    .map(
      (f) =>
        `<li class="${f.status}"><b>${f.status}</b> ${xml(f.check)} <code>${xml(f.runnable)}</code>: ${xml(f.message)}</li>`,
    )
    .join('\n');
  const lints = report.lints
    .map(
      (l) =>
        `<tr class="${l.status === 'fail' ? 'fail' : 'intended'}" data-lint="${xml(l.lint)}"><td>${l.status}</td><td>${xml(l.lint)}</td><td><code>${xml(l.object)}</code> (${xml(l.datatable)})</td><td>${xml(l.status === 'fail' ? l.message : (l.intended ?? ''))}</td><td>${xml(l.status === 'fail' ? l.fix : '')}</td></tr>`,
    )
    .join('\n');
  const { summary } = report;
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>viewer-cache audit: ${xml(report.apps)} — ${report.status}</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1b1b1b}
table{border-collapse:collapse;margin:1rem 0}th,td{border:1px solid #ccc;padding:.35rem .5rem;vertical-align:top}
thead th{background:#f3f3f3;font-weight:600}th[scope=row]{text-align:left;background:#fafafa}
th small{display:block;color:#666;font-weight:400}
td.pass{background:#e8f6ea}td.warn{background:#fff4d6}td.fail{background:#fde2e1}td.none{background:#eee}
td .status{font-weight:700;text-transform:uppercase;font-size:11px}td .reason{display:block;font-size:12px;max-width:22rem}
tr.fail td{background:#fde2e1}tr.intended td{background:#eef}
li.fail{color:#9b1c1c}li.warn{color:#7a5b00}.verdict{font-size:1.2rem;font-weight:700}
</style></head><body>
<h1>viewer-cache audit: <code>${xml(report.apps)}</code></h1>
<p class="verdict" id="verdict" data-status="${report.status}">${report.status.toUpperCase()}: ${summary.pass} passed, ${summary.warn} warned, ${summary.fail} failed, ${summary.intended} marked intended</p>
<p>Workspace <code>${xml(report.workspace)}</code>, started ${xml(report.startedAt)}, ${(report.durationMs / 1000).toFixed(1)} s${xml(executedBy(report))}. Each cell: what the viewer is served through the cache, checked against the viewer's own run in a fresh process; the second request's hit or miss; why it passes, warns or fails.</p>
<h2>Viewers × runnables</h2>
<table id="matrix"><thead><tr><th>viewer</th>${head}</tr></thead><tbody>
${body}
</tbody></table>
<h2>Findings</h2>
<ul id="findings">${findings || '<li>none</li>'}</ul>
<h2>Policy lints</h2>
<table id="lints"><thead><tr><th>status</th><th>lint</th><th>object</th><th>why</th><th>fix</th></tr></thead><tbody>
${lints || '<tr><td colspan="5">no finding</td></tr>'}
</tbody></table>
</body></html>
`;
}

function cellHtml(cell: AuditCell | undefined): string {
  if (cell === undefined) return '<td class="none">—</td>';
  const seen =
    cell.rows === null
      ? `refused ${cell.code ?? ''}`
      : `${cell.rows} row${cell.rows === 1 ? '' : 's'}`;
  return `<td class="${cell.status}" data-runnable="${xml(cell.runnable)}" data-viewer="${xml(cell.viewer)}" data-status="${cell.status}"><span class="status">${cell.status}</span> ${xml(seen)} · ${cell.cache}<span class="reason">${xml(cell.reasons.join('; '))}</span></td>`;
}
