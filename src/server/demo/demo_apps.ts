/*
 * The demo branch of loading apps: `loadApps('demo')` serves the demo's two worlds (orders and
 * clinics), anything else is an apps module's path. It lives with the demo so that the loader of
 * your apps module knows nothing of the demo built on it.
 */
import type { AppsContext, ServedApps } from '../apps/apps.js';
import { loadAppsModule, serveAppsDefinitions } from '../apps/apps_loader.js';
import ordersApps from './demo.js';
import clinicsApps from './demo_clinics.js';

/** The `source` of {@link loadApps} that names the built-in demo (both of its worlds). */
export const DEMO_APPS = 'demo';

/**
 * Loads what the server serves: {@link DEMO_APPS} for the demo's two modules, else the apps
 * module at the path `source` (see `loadAppsModule`).
 */
export async function loadApps(source: string, context: AppsContext): Promise<ServedApps> {
  if (source !== DEMO_APPS) return loadAppsModule(source, context);
  return serveAppsDefinitions(
    [
      { exported: ordersApps, label: 'demo' },
      { exported: clinicsApps, label: 'demo clinics' },
    ],
    context,
  );
}
