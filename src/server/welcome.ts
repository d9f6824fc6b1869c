import { DEMO_WORKSPACE } from './demo.js';
import { CLINIC_USERS, CLINICS_APP } from './demo_clinics.js';

/** Where the welcome goes: a stream that may be a terminal. */
export interface WelcomeOutput {
  readonly isTTY?: boolean;
  write(text: string): unknown;
}

/**
 * What `serve` prints once it listens. The demo users' tokens (and, with `--json`, the
 * publisher's, a workspace admin) are printed only to a terminal: stdout that is a pipe or a
 * file is a log stream, kept by whoever collects logs. Elsewhere, `token create` makes tokens.
 */
export function printWelcome(
  out: WelcomeOutput,
  url: string,
  demoTokens: Readonly<Record<string, string>>,
  json: boolean,
): void {
  const tokens = out.isTTY === true ? demoTokens : {};
  if (json) {
    out.write(`${JSON.stringify({ url, ...(out.isTTY === true ? { tokens } : {}) })}\n`);
    return;
  }
  const lines = [`viewer-cache listening on ${url}`, ''];
  const users = Object.entries(tokens).filter(([email]) => !email.startsWith('publisher'));
  if (users.length > 0) {
    lines.push('Try (each user sees only their rows; run twice for a cache hit):');
    const post = (path: string, value: string, body: unknown) =>
      `  curl -s -X POST ${url}/api/w/${DEMO_WORKSPACE}/${path} -H 'authorization: Bearer ${value}' -H 'content-type: application/json' -d '${JSON.stringify(body)}'`;
    let clinicsToken: string | undefined;
    for (const [email, value] of users) {
      const clinic = Object.hasOwn(CLINIC_USERS, email)
        ? CLINIC_USERS[email as keyof typeof CLINIC_USERS]
        : undefined;
      if (clinic === undefined) {
        lines.push(`  # ${email}`);
        lines.push(post('apps/orders-dashboard/run', value, { path: 'f/orders/list' }));
        continue;
      }
      clinicsToken ??= value;
      // The clinics app (the row-level-security guide's dataset): patients, or counts for admins.
      const path = clinic.group === 'system_admins' ? 'f/clinics/counts' : 'f/clinics/patients';
      lines.push(
        `  # ${email} (clinics: ${clinic.group}, entitled to ${clinic.systems.join(', ') || 'nothing'})`,
      );
      lines.push(post(`apps/${CLINICS_APP}/run`, value, { path }));
    }
    if (clinicsToken !== undefined) {
      lines.push("  # one run per provider, each delivered to that provider's outbox only");
      lines.push(
        post(`apps/${CLINICS_APP}/runs/per-recipient`, clinicsToken, {
          path: 'f/clinics/patients',
          group: 'providers',
        }),
      );
      lines.push(
        `  curl -s ${url}/api/w/${DEMO_WORKSPACE}/outbox -H 'authorization: Bearer ${clinicsToken}'`,
      );
    }
  } else {
    lines.push(
      'Make a bearer token with: viewer-cache token create --user EMAIL',
      '(demo tokens are printed only when stdout is a terminal)',
    );
  }
  lines.push('  # anonymous visitor of a public app (refused: no viewer)');
  lines.push(
    `  curl -s -X POST ${url}/api/w/${DEMO_WORKSPACE}/public/apps/orders-public/run -H 'content-type: application/json' -d '{"path":"f/orders/list"}'`,
  );
  lines.push(`  curl -s ${url}/metrics | grep viewer_cache_`, '', 'Ctrl-C stops everything.');
  out.write(`${lines.join('\n')}\n`);
}
