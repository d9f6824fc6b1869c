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
export type { ScheduleDefinition } from './apps/scheduler.js';
export { DEMO_APPS, loadApps } from './demo/demo_apps.js';
export type { EmbeddedPostgresHandle } from './process/embedded_postgres.js';
export { startEmbeddedPostgres } from './process/embedded_postgres.js';
export type { Recipients } from './recipients/per_recipient_runs.js';
