/**
 * What an apps module tells `viewer-cache audit`: which runnables are safe to run as every
 * viewer (a runnable may write or send mail, so none is run unless listed), with the args to
 * run them with and what must hold for every viewer; and which database objects are meant to
 * be as they are (a directory table, an aggregate view), so their lint is reported as intended.
 */

/** Expectations checked for every viewer of the audit. */
export interface AuditExpectations {
  /** No row of the answer has any of these columns (aggregate-only runnables). @default [] */
  readonly noColumns?: readonly string[];
  /** A viewer with no role in the data tables the runnable reads is refused. @default false */
  readonly refusedWithoutRole?: boolean;
}

/** One audited runnable. `true` is `{}`. */
export interface AuditedRunnable {
  /** The args every audited run gets. @default {} */
  readonly args?: Readonly<Record<string, unknown>>;
  /**
   * Every viewer is meant to get the same answer (a directory): not flagged as "does it read as
   * the viewer?". @default false
   */
  readonly sameForEveryone?: boolean;
  readonly expect?: AuditExpectations;
}

/** An apps module's `audit` field. */
export interface AuditDefinition {
  /** Runnable path → how to audit it. Only these are run. */
  readonly runnables: Readonly<Record<string, AuditedRunnable | true>>;
  /** `schema.name` → why it is meant to be so (see the policy lints). @default {} */
  readonly intended?: Readonly<Record<string, string>>;
}

/** An audit definition as served: every runnable's entry spelled out. Frozen. */
export interface ServedAudit {
  readonly runnables: Readonly<Record<string, AuditedRunnable>>;
  readonly intended: Readonly<Record<string, string>>;
}

export const NO_AUDIT: ServedAudit = Object.freeze({
  runnables: Object.freeze({}),
  intended: Object.freeze({}),
});

/**
 * Checks an apps module's `audit` field against its runnables; `refuse` builds the error naming
 * the field.
 */
export function checkAudit(
  value: unknown,
  hasRunnable: (path: string) => boolean,
  refuse: (what: string) => Error,
): ServedAudit {
  if (value === undefined) return NO_AUDIT;
  if (!isRecord(value)) throw refuse('audit must be { runnables, intended? }');
  for (const key of Object.keys(value))
    if (key !== 'runnables' && key !== 'intended')
      throw refuse(`audit: unknown field ${JSON.stringify(key)}`);
  if (!isRecord(value['runnables'])) throw refuse('audit.runnables must be an object by path');
  const runnables: Record<string, AuditedRunnable> = {};
  for (const [path, entry] of Object.entries(value['runnables'])) {
    const at = `audit.runnables[${JSON.stringify(path)}]`;
    if (!hasRunnable(path)) throw refuse(`${at} names no runnable`);
    if (entry === true) {
      runnables[path] = Object.freeze({});
      continue;
    }
    if (!isRecord(entry))
      throw refuse(`${at} must be true or { args?, sameForEveryone?, expect? }`);
    for (const key of Object.keys(entry))
      if (!['args', 'sameForEveryone', 'expect'].includes(key))
        throw refuse(`${at}: unknown field ${JSON.stringify(key)}`);
    if (entry['args'] !== undefined && !isRecord(entry['args']))
      throw refuse(`${at}.args must be an object`);
    if (entry['sameForEveryone'] !== undefined && typeof entry['sameForEveryone'] !== 'boolean')
      throw refuse(`${at}.sameForEveryone must be true or false`);
    const expect = entry['expect'];
    if (expect !== undefined) {
      if (!isRecord(expect)) throw refuse(`${at}.expect must be an object`);
      for (const key of Object.keys(expect))
        if (key !== 'noColumns' && key !== 'refusedWithoutRole')
          throw refuse(`${at}.expect: unknown field ${JSON.stringify(key)}`);
      const columns = expect['noColumns'];
      if (
        columns !== undefined &&
        (!Array.isArray(columns) || columns.some((c) => typeof c !== 'string'))
      )
        throw refuse(`${at}.expect.noColumns must be an array of column names`);
      if (
        expect['refusedWithoutRole'] !== undefined &&
        typeof expect['refusedWithoutRole'] !== 'boolean'
      )
        throw refuse(`${at}.expect.refusedWithoutRole must be true or false`);
    }
    runnables[path] = Object.freeze({ ...entry }) as AuditedRunnable;
  }
  const intended = value['intended'] ?? {};
  if (!isRecord(intended) || Object.values(intended).some((why) => typeof why !== 'string'))
    throw refuse('audit.intended must map schema.name to the reason it is meant to be so');
  return Object.freeze({
    runnables: Object.freeze(runnables),
    intended: Object.freeze({ ...(intended as Record<string, string>) }),
  });
}

/** Several modules' audits together; a runnable or object two of them name is refused. */
export function mergeAudits(parts: readonly ServedAudit[], refuse: (what: string) => Error) {
  const runnables: Record<string, AuditedRunnable> = {};
  const intended: Record<string, string> = {};
  for (const part of parts) {
    for (const [path, entry] of Object.entries(part.runnables)) {
      if (Object.hasOwn(runnables, path))
        throw refuse(`two apps modules audit the runnable ${JSON.stringify(path)}`);
      runnables[path] = entry;
    }
    for (const [name, why] of Object.entries(part.intended)) intended[name] = why;
  }
  return Object.freeze({
    runnables: Object.freeze(runnables),
    intended: Object.freeze(intended),
  }) as ServedAudit;
}

function isRecord(value: unknown): value is Record<string, unknown> {
  return value !== null && typeof value === 'object' && !Array.isArray(value);
}
