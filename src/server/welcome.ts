import { DEMO_WORKSPACE } from './demo.js';

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
    for (const [email, value] of users) {
      lines.push(`  # ${email}`);
      lines.push(
        `  curl -s -X POST ${url}/api/w/${DEMO_WORKSPACE}/apps/orders-dashboard/run -H 'authorization: Bearer ${value}' -H 'content-type: application/json' -d '{"path":"f/orders/list"}'`,
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
