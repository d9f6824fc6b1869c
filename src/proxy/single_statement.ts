/**
 * A lexical check of SQL text sent through the query proxy: exactly one statement, and not one
 * that changes the session's role. Postgres would take several statements in one simple-protocol
 * message (which is what a query without parameters uses), so the count is ours to enforce.
 *
 * It knows the lexical forms that can hide a `;`: '…' strings (with '' inside), E'…' strings
 * (with \' inside), "…" identifiers, $tag$…$tag$ bodies, -- comments and nested /* *\/
 * comments. Text it cannot read to the end (an unterminated quote or comment) is refused rather
 * than guessed at: fail closed.
 */

/** Why a text was refused, or null when it is one acceptable statement. */
export type StatementRefusal = 'empty' | 'several statements' | 'role change' | 'unterminated';

/** The words of one statement outside quotes and comments (lowercased), or a refusal. */
export function checkSingleStatement(sql: string): StatementRefusal | null {
  const words: string[] = [];
  let ended = false; // a top-level `;` was seen
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i]!;
    const next = sql[i + 1];
    if (c === '-' && next === '-') {
      const eol = sql.indexOf('\n', i);
      i = eol === -1 ? n : eol + 1;
      continue;
    }
    if (c === '/' && next === '*') {
      let depth = 1;
      i += 2;
      while (i < n && depth > 0) {
        if (sql[i] === '/' && sql[i + 1] === '*') {
          depth++;
          i += 2;
        } else if (sql[i] === '*' && sql[i + 1] === '/') {
          depth--;
          i += 2;
        } else i++;
      }
      if (depth > 0) return 'unterminated';
      continue;
    }
    if (/\s/.test(c)) {
      i++;
      continue;
    }
    if (ended) return 'several statements';
    if (c === ';') {
      ended = true;
      i++;
      continue;
    }
    if (c === "'" || c === '"') {
      const backslashes = c === "'" && i > 0 && /[eE]/.test(sql[i - 1]!) && !wordChar(sql[i - 2]);
      const end = closeQuote(sql, i, c, backslashes);
      if (end === -1) return 'unterminated';
      i = end;
      continue;
    }
    if (c === '$') {
      const tag = /^\$([A-Za-z_][A-Za-z0-9_]*)?\$/.exec(sql.slice(i, i + 66));
      if (tag !== null && !wordChar(sql[i - 1])) {
        const close = sql.indexOf(tag[0], i + tag[0].length);
        if (close === -1) return 'unterminated';
        i = close + tag[0].length;
        continue;
      }
    }
    if (wordChar(c)) {
      let j = i;
      while (j < n && wordChar(sql[j])) j++;
      if (words.length < 4) words.push(sql.slice(i, j).toLowerCase());
      i = j;
      continue;
    }
    i++;
  }
  if (words.length === 0) return 'empty';
  if (changesRole(words)) return 'role change';
  return null;
}

/**
 * `SET [SESSION|LOCAL] ROLE …`, `RESET ROLE`, `SET [SESSION|LOCAL] SESSION AUTHORIZATION …`,
 * `RESET SESSION AUTHORIZATION`. The login could only narrow itself (its own privileges are its
 * memberships, SPEC 6) and the connection is reset on release anyway; through the proxy they
 * are refused outright, so an agent's statement never runs under any role but the one leased.
 */
function changesRole(words: readonly string[]): boolean {
  const [first, ...rest] = words;
  if (first !== 'set' && first !== 'reset') return false;
  const changes = (w: readonly string[]) =>
    w[0] === 'role' || (w[0] === 'session' && w[1] === 'authorization');
  // `SET SESSION AUTHORIZATION` and `SET SESSION ROLE` both start with `session`: try both readings.
  if (changes(rest)) return true;
  return (
    first === 'set' && (rest[0] === 'session' || rest[0] === 'local') && changes(rest.slice(1))
  );
}

function wordChar(c: string | undefined): boolean {
  return c !== undefined && /[A-Za-z0-9_]/.test(c);
}

/** Index just past the quote that closes the one opened at `start`, or -1. */
function closeQuote(sql: string, start: number, quote: string, backslashes: boolean): number {
  let i = start + 1;
  while (i < sql.length) {
    const c = sql[i];
    if (backslashes && c === '\\') {
      i += 2;
      continue;
    }
    if (c === quote) {
      if (sql[i + 1] === quote) {
        i += 2;
        continue;
      }
      return i + 1;
    }
    i++;
  }
  return -1;
}
