import {
  type DatatableRef,
  formatDatatableRef,
  parseDatatableRef,
} from '../../connector/datatable_ref.js';
import { DuckdbRefusedError } from '../../errors.js';

/**
 * A DuckDB runnable's script, read once at registration: which data tables it attaches (under
 * which alias), which `alias.schema.table` it reads, and the statements left to run once those
 * tables are copied in. Everything else is refused here, before a connection or a DuckDB
 * instance exists; the instance's own locks (no external access, configuration locked, no
 * extension autoload) are the second wall, for whatever this reading misses.
 */
export interface DuckdbScript {
  /** One per `ATTACH 'datatable://…' AS alias`, by alias (lowercase, as DuckDB folds it). */
  readonly attachments: ReadonlyMap<string, DatatableRef>;
  /** Every `alias.schema.table` the statements name, each once, in order of first use. */
  readonly tables: readonly DuckdbTable[];
  /** The statements to run, ATTACHes removed; the last one's rows are the result. */
  readonly statements: readonly string[];
}

export interface DuckdbTable {
  readonly alias: string;
  readonly schema: string;
  readonly table: string;
}

/** What may start a statement: queries, and the script's own temporary objects. */
const QUERY_STARTS = new Set(['select', 'with', 'from', 'values', 'table', '(']);
/** `CREATE …` of these, in the script's own (main) database only. */
const CREATABLE = new Set(['table', 'view', 'macro', 'function']);

interface Token {
  /** `word` (unquoted, lowercased), `ident` ("quoted", exact), `string`, `number`, `punct`. */
  readonly kind: 'word' | 'ident' | 'string' | 'number' | 'punct';
  readonly text: string;
  readonly start: number;
  readonly end: number;
}

/**
 * Reads `sql` as {@link DuckdbScript}.
 * @throws {DuckdbRefusedError} for any statement outside the sandbox (a second ATTACH, SET,
 *   INSTALL, LOAD, COPY, PRAGMA, a write, …).
 * @throws {InvalidDatatableRefError} for a malformed `datatable://` reference.
 */
export function parseDuckdbScript(sql: string): DuckdbScript {
  if (typeof sql !== 'string' || sql.trim().length === 0)
    throw new DuckdbRefusedError('a DuckDB runnable needs a non-empty sql script');
  const attachments = new Map<string, DatatableRef>();
  const rest: Token[][] = [];
  for (const statement of splitStatements(tokenize(sql))) {
    const first = statement[0]!;
    if (first.kind === 'word' && first.text === 'attach') {
      const { alias, ref } = readAttach(statement);
      if (attachments.has(alias))
        throw new DuckdbRefusedError(`the alias ${alias} is attached twice`);
      attachments.set(alias, ref);
    } else {
      checkStatement(statement, attachments);
      rest.push(statement);
    }
  }
  if (attachments.size === 0)
    throw new DuckdbRefusedError(
      "a DuckDB runnable attaches a data table: ATTACH 'datatable://NAME?as=viewer' AS alias",
    );
  if (rest.length === 0) throw new DuckdbRefusedError('the script has no query to run');
  const tables = new Map<string, DuckdbTable>();
  for (const statement of rest) {
    // A CREATE naming an attached alias was refused above, so only reads are found here.
    for (const found of tableNames(statement, attachments)) {
      const key = JSON.stringify([found.alias, found.schema, found.table]);
      if (!tables.has(key)) tables.set(key, found);
    }
  }
  return {
    attachments,
    tables: [...tables.values()],
    statements: rest.map((s) => sql.slice(s[0]!.start, s[s.length - 1]!.end)),
  };
}

/** `ATTACH [DATABASE] 'datatable://…' [AS] alias`, nothing more (no options, no IF NOT EXISTS). */
function readAttach(statement: Token[]): { alias: string; ref: DatatableRef } {
  let i = 1;
  if (statement[i]?.kind === 'word' && statement[i]!.text === 'database') i++;
  const target = statement[i++];
  if (target?.kind !== 'string' || !target.text.startsWith('datatable://'))
    throw new DuckdbRefusedError(
      "a DuckDB runnable may ATTACH only data tables: ATTACH 'datatable://NAME?as=viewer' AS alias",
    );
  const ref = parseDatatableRef(target.text);
  if (statement[i]?.kind === 'word' && statement[i]!.text === 'as') i++;
  const alias = statement[i++];
  if (
    alias === undefined ||
    (alias.kind !== 'word' && alias.kind !== 'ident') ||
    i !== statement.length
  )
    throw new DuckdbRefusedError(
      `ATTACH '${formatDatatableRef(ref)}' AS alias takes one alias and no options`,
    );
  return { alias: alias.kind === 'word' ? alias.text : alias.text.toLowerCase(), ref };
}

function checkStatement(statement: Token[], attachments: ReadonlyMap<string, DatatableRef>): void {
  const first = statement[0]!;
  const head = first.kind === 'word' || first.kind === 'punct' ? first.text : '';
  if (QUERY_STARTS.has(head)) return;
  if (head === 'create') {
    let i = 1;
    const word = (text: string) => statement[i]?.kind === 'word' && statement[i]!.text === text;
    if (word('or') && statement[i + 1]?.text === 'replace') i += 2;
    if (word('temp') || word('temporary')) i++;
    if (statement[i]?.kind === 'word' && CREATABLE.has(statement[i]!.text)) {
      const name = statement[i + 1];
      const qualified = statement[i + 2]?.text === '.';
      // Its own objects only: never into an attached data table (writes do not go back to it).
      if (name !== undefined && !(qualified && attachments.has(folded(name)))) return;
      throw new DuckdbRefusedError('a DuckDB script cannot write to an attached data table');
    }
  }
  throw new DuckdbRefusedError(
    `a DuckDB script may run queries only (SELECT, WITH, FROM, VALUES, CREATE TEMP TABLE/VIEW/MACRO), not ${head.toUpperCase() || 'that statement'}`,
  );
}

/** Every `alias.schema.table` whose alias is attached (not itself part of a longer name). */
function tableNames(statement: Token[], attachments: ReadonlyMap<string, DatatableRef>) {
  const found: DuckdbTable[] = [];
  const isName = (t: Token | undefined) =>
    t !== undefined && (t.kind === 'word' || t.kind === 'ident');
  for (let i = 0; i + 4 < statement.length; i++) {
    const [a, d1, s, d2, t] = statement.slice(i, i + 5);
    if (!isName(a) || d1!.text !== '.' || !isName(s) || d2!.text !== '.' || !isName(t)) continue;
    if (statement[i - 1]?.text === '.') continue;
    const alias = folded(a!);
    if (!attachments.has(alias)) continue;
    found.push({ alias, schema: pgName(s!), table: pgName(t!) });
  }
  return found;
}

/** DuckDB folds identifiers case-insensitively; aliases are kept lowercase. */
function folded(token: Token): string {
  return token.text.toLowerCase();
}

/** A name as Postgres reads it: unquoted folds to lowercase (the lexer did), quoted is exact. */
function pgName(token: Token): string {
  return token.text;
}

function splitStatements(tokens: Token[]): Token[][] {
  const statements: Token[][] = [];
  let current: Token[] = [];
  for (const token of tokens) {
    if (token.kind === 'punct' && token.text === ';') {
      if (current.length > 0) statements.push(current);
      current = [];
    } else current.push(token);
  }
  if (current.length > 0) statements.push(current);
  return statements;
}

/** Enough of DuckDB's lexer to tell names, strings and comments apart. */
function tokenize(sql: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  const n = sql.length;
  while (i < n) {
    const c = sql[i]!;
    if (/\s/.test(c)) {
      i++;
    } else if (c === '-' && sql[i + 1] === '-') {
      while (i < n && sql[i] !== '\n') i++;
    } else if (c === '/' && sql[i + 1] === '*') {
      const end = sql.indexOf('*/', i + 2);
      if (end === -1) throw new DuckdbRefusedError('unterminated /* comment');
      i = end + 2;
    } else if (c === "'" || c === '"') {
      const start = i;
      let text = '';
      i++;
      for (;;) {
        if (i >= n) throw new DuckdbRefusedError('unterminated quoted text');
        if (sql[i] === c) {
          if (sql[i + 1] === c) {
            text += c;
            i += 2;
            continue;
          }
          i++;
          break;
        }
        text += sql[i++];
      }
      tokens.push({ kind: c === "'" ? 'string' : 'ident', text, start, end: i });
    } else if (c === '$') {
      // Dollar quoting ($$…$$, $tag$…$tag$): read as a string.
      const tag = /^\$[A-Za-z_]*\$/.exec(sql.slice(i))?.[0];
      if (tag === undefined) {
        tokens.push({ kind: 'punct', text: c, start: i, end: ++i });
        continue;
      }
      const end = sql.indexOf(tag, i + tag.length);
      if (end === -1) throw new DuckdbRefusedError('unterminated $-quoted text');
      tokens.push({
        kind: 'string',
        text: sql.slice(i + tag.length, end),
        start: i,
        end: end + tag.length,
      });
      i = end + tag.length;
    } else if (/[A-Za-z_]/.test(c)) {
      const start = i;
      while (i < n && /[A-Za-z0-9_$]/.test(sql[i]!)) i++;
      tokens.push({ kind: 'word', text: sql.slice(start, i).toLowerCase(), start, end: i });
    } else if (/[0-9]/.test(c)) {
      const start = i;
      while (i < n && /[0-9.eE_]/.test(sql[i]!)) i++;
      tokens.push({ kind: 'number', text: sql.slice(start, i), start, end: i });
    } else {
      tokens.push({ kind: 'punct', text: c, start: i, end: ++i });
    }
  }
  return tokens;
}
