import { createHash } from 'node:crypto';
import { formatDatatableRef } from '../connector/datatable_ref.js';
import type { Job } from '../job.js';
import type { JobAuthorization } from './access/authorization.js';
import { type DependencySet, parseDependency } from './access/dependency.js';
import { RoleSetProtocol } from './logins/role_set_protocol.js';

/**
 * What the data tables would do for a job, for `viewer-cache explain`: the learned set of
 * questions its runnable version asks, what each is answered (roles and login, or the refusal's
 * code) and the digest of the fingerprint the cache key carries. Names of roles and logins only:
 * never a password, a row or the fingerprint's text.
 */
export interface JobExplanation {
  /** The learned dependency set, as text; null: nothing learned yet (the full fingerprint). */
  readonly dependencies: readonly string[] | null;
  /** Per question of the set (or, none learned, the viewer's request of every data table). */
  readonly answers: ReadonlyArray<{
    readonly question: string;
    readonly roles?: readonly string[];
    /** The login the connection would use: the role's own, or the set login of its roles. */
    readonly login?: string;
    readonly refused?: string;
    readonly holds?: boolean;
  }>;
  /** SHA-256 (hex) of the fingerprint in the key: it moves when any answer moves. */
  readonly fingerprintDigest: string;
}

/** Explains `job` from its authorization and learned set (see {@link JobExplanation}). */
export function explainJob(
  job: Job,
  authorization: JobAuthorization,
  set: DependencySet,
  datatables: readonly string[],
  fingerprint: string,
): JobExplanation {
  const questions = set.everything
    ? datatables.map((name) => JSON.stringify(['v', name]))
    : set.members;
  const answers = questions.map((question) => {
    const parsed = parseDependency(question);
    if ('every' in parsed) return { question: '*' };
    if ('holds' in parsed) {
      const { datatable, role } = parsed.holds;
      return {
        question: `holds ${datatable}.${role}`,
        holds: authorization.viewerHolds(datatable, role),
      };
    }
    const text = formatDatatableRef(parsed.ref);
    try {
      const grant = authorization.grant(parsed.ref);
      const roles = grant.roles.map((role) => role.name);
      const login =
        grant.roles.length === 1
          ? grant.roles[0]!.name
          : RoleSetProtocol.loginName(grant.roles.map((role) => role.oid));
      return { question: text, roles, login };
    } catch (err) {
      const code = (err as { code?: unknown }).code;
      return { question: text, refused: typeof code === 'string' ? code : 'E_REFUSED' };
    }
  });
  void job;
  return {
    dependencies: set.everything ? null : set.members.map(describe),
    answers,
    fingerprintDigest: createHash('sha256').update(fingerprint).digest('hex'),
  };
}

function describe(dependency: string): string {
  const parsed = parseDependency(dependency);
  if ('every' in parsed) return '*';
  if ('holds' in parsed) return `holds ${parsed.holds.datatable}.${parsed.holds.role}`;
  return formatDatatableRef(parsed.ref);
}
