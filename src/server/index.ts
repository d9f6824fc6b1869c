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
} from './apps.js';
export { defineApps } from './apps.js';
export { DEMO_APPS, loadApps } from './apps_loader.js';
export type { EmbeddedPostgresHandle } from './embedded_postgres.js';
export { startEmbeddedPostgres } from './embedded_postgres.js';
export type { ScheduleDefinition } from './scheduler.js';
