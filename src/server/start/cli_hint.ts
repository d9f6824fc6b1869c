/**
 * How a person runs the CLI where this process runs, for the hints it prints: from the
 * TypeScript sources (a checkout: `viewer-cache` is no command there, and `npx viewer-cache`
 * needs a built `dist/`) it is `npm run -s cli --`; from `dist/` (an installed package) it is
 * `npx viewer-cache`.
 */
export function cliCommand(moduleUrl: string = import.meta.url): string {
  return moduleUrl.endsWith('.ts') ? 'npm run -s cli --' : 'npx viewer-cache';
}
