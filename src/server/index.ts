/**
 * The reference server's public entry (`viewer-cache/server`): what an apps module and a
 * program embedding the server need. The library itself is `viewer-cache`.
 */
export type {
  AppDefinition,
  Apps,
  AppsContext,
  AppsDefinition,
  AppsExport,
  ServedApps,
} from './apps/apps.js';
export { defineApps } from './apps/apps.js';
export type {
  AuditDefinition,
  AuditExpectations,
  AuditedRunnable,
  ServedAudit,
} from './apps/audit_definition.js';
export type { ScheduleDefinition } from './apps/scheduler.js';
export { renderHtml, renderJunit, renderSummary } from './audit/audit_formats.js';
export type {
  AuditCell,
  AuditFinding,
  AuditReport,
  AuditStatus,
} from './audit/audit_report.js';
export type { RawAuditOptions } from './audit/audit_runner.js';
export { runAudit } from './audit/audit_runner.js';
export type { AuditViewer } from './audit/viewer_set.js';
export { parseViewerFile } from './audit/viewer_set.js';
export { DEMO_APPS, loadApps } from './demo/demo_apps.js';
export type { EmbeddedPostgresHandle } from './process/embedded_postgres.js';
export { startEmbeddedPostgres } from './process/embedded_postgres.js';
export type { Recipients } from './recipients/per_recipient_runs.js';
