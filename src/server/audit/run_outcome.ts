/**
 * What one audited run gave, in a form two processes can compare: the answer's JSON, or the
 * code it was refused with. The same function runs in the audit and in its fresh processes.
 */
import stringify from 'fast-json-stable-stringify';
import type { Executor, JobExecutor, RunOrigin } from '../../index.js';

/** A run's answer (its JSON, parsed) or its refusal's code. */
export type RunOutcome =
  | { readonly value: unknown; readonly fromCache: boolean }
  | { readonly code: string };

/** One run the audit asks for. */
export interface AuditRun {
  readonly workspace: string;
  readonly path: string;
  readonly args: Readonly<Record<string, unknown>>;
  readonly runAs: string;
  readonly origin: RunOrigin;
  readonly roleScope?: readonly number[];
}

/** Runs `run` through `through` (the executor, or the cache around it). */
export async function runOutcome(
  executor: Executor,
  through: JobExecutor,
  run: AuditRun,
): Promise<RunOutcome> {
  try {
    const job = executor.createJob({
      workspace: run.workspace,
      path: run.path,
      args: { ...run.args },
      runAs: run.runAs,
      origin: run.origin,
      ...(run.roleScope ? { roleScope: run.roleScope } : {}),
    });
    const result = await through.run(job);
    return {
      value: JSON.parse(Buffer.from(result.json()).toString('utf8')),
      fromCache: result.fromCache,
    };
  } catch (err) {
    const code = (err as { code?: unknown }).code;
    return { code: typeof code === 'string' ? code : 'E_UNCODED' };
  }
}

/** Two outcomes are the same answer (or the same refusal), whether cached or not. */
export function sameOutcome(a: RunOutcome, b: RunOutcome): boolean {
  return canonical(a) === canonical(b);
}

/** An outcome as one canonical string. */
export function canonical(outcome: RunOutcome): string {
  return 'code' in outcome ? `code:${outcome.code}` : `value:${stringify(outcome.value)}`;
}

/** The rows of an answer: its elements when it is an array, else the answer itself. */
export function rowsOf(outcome: RunOutcome): unknown[] {
  if ('code' in outcome) return [];
  if (Array.isArray(outcome.value)) return outcome.value;
  return outcome.value === null || outcome.value === undefined ? [] : [outcome.value];
}
