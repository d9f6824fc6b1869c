import type { Job } from '../../src/index.js';

let next = 0;

/** A job with sensible defaults; override any part. */
export function makeJob(
  overrides: Partial<Omit<Job, 'perms' | 'runnable'>> & {
    path?: string;
    hash?: string;
    viewer?: string | null;
    runAs?: string;
  } = {},
): Job {
  const {
    path = 'f/app/report',
    hash = 'h1',
    viewer = null,
    runAs = 'publisher@example.com',
  } = overrides;
  return {
    id: overrides.id ?? `job-${++next}`,
    workspace: overrides.workspace ?? 'ws',
    runnable: { path, hash },
    args: overrides.args ?? {},
    perms: { email: runAs, endUserEmail: viewer },
    ...('cacheTtlS' in overrides ? { cacheTtlS: overrides.cacheTtlS } : { cacheTtlS: 60 }),
  };
}
