/**
 * What the query proxy runs, decided by Postgres's own grammar: libpg_query (the server's parser
 * compiled to WebAssembly, shipped inside its npm package) reads the text, and the proxy runs it
 * only when it is exactly one statement of these kinds
 *
 *   SELECT (VALUES, TABLE, WITH …)   INSERT   UPDATE   DELETE   MERGE   SHOW   EXPLAIN of one of these
 *
 * with every statement nested in it (a data-modifying WITH, EXPLAIN's query) of these kinds too,
 * and no call of a function named `set_config` anywhere in it. Everything else is refused:
 * SET and RESET in every spelling (quoted `"role"`, `LOCAL`, `SESSION AUTHORIZATION`, `RESET ALL`),
 * `set_config('role', …)` however its arguments are built, EXECUTE of a prepared statement, DO,
 * CALL, PREPARE, COPY, DISCARD, transaction control (outside the proxy's own transactions, see
 * {@link transactionVerdict}) and all DDL. An allowlist of what the
 * grammar *decided* the text is, rather than a scan for words that look like a role change: a
 * spelling nobody thought of is a kind not on the list.
 *
 * What it cannot see: a function the database's owner wrote that changes a setting inside its
 * body runs as written. The login can only narrow itself (SPEC 6) and the connection is reset
 * on release, after this one statement.
 *
 * The parser reads text as a server with `standard_conforming_strings = on` does; the proxy sets
 * that on the lease before the statement, so Postgres reads the bytes the way they were checked.
 */
import { loadModule, parseSync } from 'libpg-query';
import { LRUCache } from 'lru-cache';

/** Why a text was refused. */
export type StatementRefusal = 'empty' | 'several statements' | 'role change' | 'statement kind';

/**
 * The proxy's verdict on one text: null when it runs; a refusal with the node kind that decided
 * it (`VariableSetStmt`, `DoStmt`, `FuncCall set_config`, …: never a literal of the text); or
 * the grammar's own syntax error, as Postgres would report it (1-based character position).
 */
export type StatementVerdict =
  | null
  | { readonly refusal: StatementRefusal; readonly node: string }
  | { readonly syntaxError: string; readonly position: number };

/** The statement kinds the proxy runs (libpg_query's node names). */
const RUNS = new Set([
  'SelectStmt',
  'InsertStmt',
  'UpdateStmt',
  'DeleteStmt',
  'MergeStmt',
  'VariableShowStmt',
]);
/** A wrapper that runs the statement it holds, which must itself be on the list. */
const WRAPS = new Set(['ExplainStmt']);

const STATEMENT_NODE = /^[A-Z][A-Za-z]*Stmt$/;

/** Settings whose change is a change of who the session is. */
const ROLE_SETTINGS = new Set(['role', 'session_authorization']);

/**
 * What a transaction-control statement does in the query proxy's transactions (see
 * proxy_transactions.ts): `begin` (BEGIN, START TRANSACTION, with their isolation and access
 * options), `commit` (COMMIT, END), `rollback` (ROLLBACK, ABORT), `savepoint` (SAVEPOINT,
 * RELEASE, ROLLBACK TO). Never PREPARE TRANSACTION, COMMIT/ROLLBACK PREPARED (a prepared
 * transaction outlives its session, so its lease) nor `AND CHAIN` (a COMMIT that opens the next
 * one): those stay refused as a statement kind.
 */
export type TransactionControl = 'begin' | 'commit' | 'rollback' | 'savepoint';

interface Decision {
  readonly v: StatementVerdict;
  /** Set when the text is one transaction-control statement the proxy's transactions run. */
  readonly control?: TransactionControl;
}

// Runnables send the same few texts again and again; a parse is ≈ 48 µs (measured: 10 000
// parses of a one-line SELECT on this machine class), a cached verdict a map lookup. Only
// short texts are kept, so the cache is bounded in bytes as well as entries.
const verdicts = new LRUCache<string, Decision>({ max: 512 });
const CACHED_TEXT_MAX = 4096;

let loading: Promise<void> | undefined;

/**
 * The verdict on `sql` (see the module comment) for a statement on its own: transaction
 * control is refused (`statement kind: TransactionStmt`). Loads the parser on first use.
 */
export async function statementVerdict(sql: string): Promise<StatementVerdict> {
  return (await decision(sql)).v;
}

/**
 * The verdict on `sql` where the proxy keeps transactions: the same as {@link statementVerdict},
 * except that a transaction-control statement it runs is answered with what it does.
 */
export async function transactionVerdict(
  sql: string,
): Promise<StatementVerdict | { readonly control: TransactionControl }> {
  const d = await decision(sql);
  return d.control === undefined ? d.v : { control: d.control };
}

async function decision(sql: string): Promise<Decision> {
  const cached = verdicts.get(sql);
  if (cached !== undefined) return cached;
  loading ??= loadModule();
  await loading;
  const d = decide(sql);
  if (sql.length <= CACHED_TEXT_MAX) verdicts.set(sql, d);
  return d;
}

const CONTROLS: Readonly<Record<string, TransactionControl>> = {
  TRANS_STMT_BEGIN: 'begin',
  TRANS_STMT_START: 'begin',
  TRANS_STMT_COMMIT: 'commit',
  TRANS_STMT_ROLLBACK: 'rollback',
  TRANS_STMT_SAVEPOINT: 'savepoint',
  TRANS_STMT_RELEASE: 'savepoint',
  TRANS_STMT_ROLLBACK_TO: 'savepoint',
};

function decide(sql: string): Decision {
  const v = decideVerdict(sql);
  if (v === null || !('node' in v) || v.node !== 'TransactionStmt') return { v };
  // One statement, and it is transaction control (refused on its own): which kind.
  const stmt = (parseSync(sql) as { stmts: { stmt: { TransactionStmt: TransactionNode } }[] })
    .stmts[0]!.stmt.TransactionStmt;
  const control = CONTROLS[stmt.kind ?? ''];
  return control === undefined || stmt.chain === true ? { v } : { v, control };
}

interface TransactionNode {
  readonly kind?: string;
  readonly chain?: boolean;
}

function decideVerdict(sql: string): StatementVerdict {
  // libpg_query refuses the empty string outright; to Postgres it is an empty query.
  if (sql.length === 0) return { refusal: 'empty', node: 'none' };
  let stmts: readonly { stmt?: unknown }[];
  try {
    stmts = (parseSync(sql) as { stmts?: { stmt?: unknown }[] }).stmts ?? [];
  } catch (err) {
    const details = (err as { sqlDetails?: { message?: string; cursorPosition?: number } })
      .sqlDetails;
    return {
      syntaxError: details?.message ?? (err as Error).message,
      position: (details?.cursorPosition ?? 0) + 1,
    };
  }
  if (stmts.length === 0) return { refusal: 'empty', node: 'none' };
  if (stmts.length > 1) return { refusal: 'several statements', node: 'none' };
  return refusalIn(stmts[0]!.stmt);
}

/**
 * Walks the whole tree (iteratively: a parse tree can be deep) and refuses at the first node
 * that is a statement not on the list, or a call of `set_config` (its first argument may be
 * built from anything, so every call is refused, whatever it would set).
 */
function refusalIn(root: unknown): StatementVerdict {
  const top = root !== null && typeof root === 'object' ? Object.keys(root)[0] : undefined;
  if (top === undefined || !(RUNS.has(top) || WRAPS.has(top))) {
    return refusalOfKind(root, top ?? 'none');
  }
  const stack: unknown[] = [root];
  while (stack.length > 0) {
    const node = stack.pop();
    if (node === null || typeof node !== 'object') continue;
    if (Array.isArray(node)) {
      for (const item of node) stack.push(item);
      continue;
    }
    for (const [key, value] of Object.entries(node)) {
      // Node types are capitalised (`SelectStmt`); fields are not (`selectStmt`).
      if (STATEMENT_NODE.test(key) && !RUNS.has(key) && !WRAPS.has(key)) {
        return refusalOfKind({ [key]: value }, key);
      }
      if (key === 'FuncCall' && callsSetConfig(value)) {
        return { refusal: 'role change', node: 'FuncCall set_config' };
      }
      if (value !== null && typeof value === 'object') stack.push(value);
    }
  }
  return null;
}

function refusalOfKind(node: unknown, kind: string): StatementVerdict {
  if (kind === 'VariableSetStmt') {
    const set = (node as { VariableSetStmt: { kind?: string; name?: string } }).VariableSetStmt;
    // RESET ALL resets role and session_authorization with the rest.
    if (set.kind === 'VAR_RESET_ALL' || ROLE_SETTINGS.has((set.name ?? '').toLowerCase())) {
      return { refusal: 'role change', node: kind };
    }
  }
  return { refusal: 'statement kind', node: kind };
}

/** Whether a FuncCall node names `set_config`, in any schema and any case. */
function callsSetConfig(call: unknown): boolean {
  const names = (call as { funcname?: { String?: { sval?: string } }[] }).funcname ?? [];
  const last = names[names.length - 1]?.String?.sval;
  return typeof last === 'string' && last.toLowerCase() === 'set_config';
}
