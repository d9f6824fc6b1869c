import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { describe, expect, it } from 'vitest';

// Every relative link in README.md and the guides under docs/ points at a file or folder that
// exists, and a link to a #heading of a Markdown file at a heading it has — so a guide moved,
// renamed or retitled breaks here, not in a reader's browser.

const ROOT = resolve(import.meta.dirname, '../..');

/** Text outside fenced code blocks, where a line starting with # is a heading. */
function outsideFences(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '');
}

/** Text outside code, fenced or inline, where a link is one. */
function prose(markdown: string): string {
  return outsideFences(markdown).replace(/`[^`\n]*`/g, '');
}

/** GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens. */
function slug(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N}\s_-]/gu, '')
    .replace(/\s/g, '-');
}

/** The anchors a Markdown file offers (a repeated heading gets -1, -2, … as on GitHub). */
function anchors(markdown: string): Set<string> {
  const seen = new Map<string, number>();
  const out = new Set<string>();
  for (const [, text] of outsideFences(markdown).matchAll(/^#{1,6}\s+(.+?)\s*#*$/gm)) {
    const base = slug(text!);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    out.add(n === 0 ? base : `${base}-${n}`);
  }
  return out;
}

/** The targets of inline links `[text](target)` that are not absolute URLs. */
function relativeLinks(markdown: string): string[] {
  return [...prose(markdown).matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)]
    .map((m) => m[1]!)
    .filter((target) => !/^[a-z][a-z0-9+.-]*:/i.test(target));
}

/** What is wrong with each relative link of `file` (a path under ROOT), if anything. */
function brokenLinks(file: string): string[] {
  const text = readFileSync(join(ROOT, file), 'utf8');
  const problems: string[] = [];
  for (const target of relativeLinks(text)) {
    const [path = '', anchor] = target.split('#', 2);
    const absolute = path === '' ? join(ROOT, file) : resolve(ROOT, dirname(file), decodeURI(path));
    if (!existsSync(absolute)) {
      problems.push(`${file}: (${target}) — no file ${relative(ROOT, absolute)}`);
      continue;
    }
    if (anchor === undefined || anchor === '' || !absolute.endsWith('.md')) continue;
    if (statSync(absolute).isDirectory()) continue;
    if (!anchors(readFileSync(absolute, 'utf8')).has(anchor))
      problems.push(`${file}: (${target}) — ${relative(ROOT, absolute)} has no heading #${anchor}`);
  }
  return problems;
}

const guides = readdirSync(join(ROOT, 'docs'))
  .filter((name) => name.endsWith('.md'))
  .map((name) => `docs/${name}`);

describe('documentation links', () => {
  it('reads links and anchors as GitHub does', () => {
    const sample = [
      '# Security model, on one screen',
      '## What each viewer sees: the clinics demo',
      '## `E_CODES` and more',
      '## Twice',
      '## Twice',
      '```sh',
      '# not a heading',
      '[not a link](nowhere.md)',
      '```',
      'See [a](docs/x.md#y), [b](#z), [c](https://example.com/a), `[d](inline.md)`, [e](../f/).',
    ].join('\n');
    expect([...anchors(sample)]).toEqual([
      'security-model-on-one-screen',
      'what-each-viewer-sees-the-clinics-demo',
      'e_codes-and-more',
      'twice',
      'twice-1',
    ]);
    expect(relativeLinks(sample)).toEqual(['docs/x.md#y', '#z', '../f/']);
  });

  it('the guides README links to are all there (an empty docs/ would pass vacuously)', () => {
    expect(guides).toEqual(
      expect.arrayContaining([
        'docs/getting-started.md',
        'docs/apps-and-policies.md',
        'docs/execution-modes.md',
        'docs/several-processes.md',
        'docs/configuration.md',
        'docs/errors.md',
        'docs/security-model.md',
        'docs/benchmarks.md',
      ]),
    );
    const fromReadme = relativeLinks(readFileSync(join(ROOT, 'README.md'), 'utf8'));
    const unlinked = guides.filter((guide) => !fromReadme.some((t) => t.split('#')[0] === guide));
    expect(unlinked, 'every guide has a link from README.md').toEqual([]);
  });

  it.each(['README.md', ...guides])('every relative link in %s resolves', (file) => {
    expect(brokenLinks(file)).toEqual([]);
  });

  it.each(['README.md', ...guides])(
    'every file of the repository %s names in code exists',
    (file) => {
      // `src/server/http/http_caching.ts` in prose is a pointer too: a move must update it.
      const named = [
        ...readFileSync(join(ROOT, file), 'utf8').matchAll(
          /`((?:src|test|bench|examples)\/[A-Za-z0-9_./-]+)`/g,
        ),
      ].map((m) => m[1]!);
      const missing = named.filter((path) => !existsSync(join(ROOT, path)));
      expect(missing.map((path) => `${file} names \`${path}\`, which does not exist`)).toEqual([]);
    },
  );
});
