import { DEMO_PUBLISHER, DEMO_WORKSPACE } from '../demo/demo.js';
import { CLINIC_USERS, CLINICS_APP } from '../demo/demo_clinics.js';
import { cliCommand } from './cli_hint.js';

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
  options: {
    /** The demo is served: its curl lines apply. @default true */
    demo?: boolean;
    /** How the CLI is run here (cli_hint.ts). @default cliCommand() */
    cli?: string;
  } = {},
): void {
  const demo = options.demo ?? true;
  const cli = options.cli ?? cliCommand();
  const tokens = out.isTTY === true ? demoTokens : {};
  if (json) {
    out.write(`${JSON.stringify({ url, ...(out.isTTY === true ? { tokens } : {}) })}\n`);
    return;
  }
  const lines = [`viewer-cache listening on ${url}`, ''];
  const users = Object.entries(tokens).filter(([email]) => !email.startsWith('publisher'));
  if (users.length > 0) {
    lines.push('Try (each user sees only their rows; run twice for a cache hit):');
    // `value` is a token, or a shell variable holding one (then the header is double-quoted).
    const post = (path: string, value: string, body: unknown) => {
      const q = value.startsWith('$') ? '"' : "'";
      return `  curl -s -X POST ${url}/api/w/${DEMO_WORKSPACE}/${path} -H ${q}authorization: Bearer ${value}${q} -H 'content-type: application/json' -d '${JSON.stringify(body)}'`;
    };
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
      // The clinics app (the row-level-security guide's dataset): patients for providers,
      // counts for everyone else.
      const groups: readonly string[] = clinic.groups;
      const path = groups.includes('providers') ? 'f/clinics/patients' : 'f/clinics/counts';
      lines.push(
        `  # ${email} (clinics: ${groups.join(' + ')}, entitled to ${clinic.systems.join(', ') || 'nothing'})`,
      );
      lines.push(post(`apps/${CLINICS_APP}/run`, value, { path }));
    }
    if (clinicsToken !== undefined) {
      // A batch is the publisher's (or a workspace admin's) to start, and a workspace admin's
      // token is not printed here: the line names where it comes from instead.
      lines.push(
        "  # one run per provider, each delivered to that provider's outbox only; only the app's",
        '  # publisher (or a workspace admin) may start one, with a token of their own:',
        `  PUBLISHER_TOKEN=$(${cli} --json token create --user ${DEMO_PUBLISHER} | jq -r .token)`,
      );
      lines.push(
        post(`apps/${CLINICS_APP}/runs/per-recipient`, '$PUBLISHER_TOKEN', {
          path: 'f/clinics/patients',
          group: 'providers',
        }),
      );
      lines.push(
        `  curl -s ${url}/api/w/${DEMO_WORKSPACE}/outbox -H 'authorization: Bearer ${clinicsToken}'`,
      );
    }
  } else {
    lines.push(`Make a bearer token with: ${cli} token create --user EMAIL`);
    if (demo) lines.push('(demo tokens are printed only when stdout is a terminal)');
  }
  if (demo) {
    lines.push('  # anonymous visitor of a public app (refused: no viewer)');
    lines.push(
      `  curl -s -X POST ${url}/api/w/${DEMO_WORKSPACE}/public/apps/orders-public/run -H 'content-type: application/json' -d '{"path":"f/orders/list"}'`,
    );
  }
  lines.push(`  curl -s ${url}/metrics | grep viewer_cache_`, '', 'Ctrl-C stops everything.');
  out.write(`${lines.join('\n')}\n`);
}
