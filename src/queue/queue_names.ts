import { WORKSPACE_RE } from '../job.js';

/**
 * The queue's defaults, shared by servers and workers. The prefix is a Redis Cluster hash tag:
 * every key of the queue (and the workers' heartbeats) lands in one slot, which BullMQ's scripts
 * need on a Cluster, and it is the same on a single node.
 */
export const QUEUE_DEFAULTS = Object.freeze({
  prefix: '{viewer-cache}',
  name: 'jobs',
});

/** A worker group: who takes a workspace's jobs (an agent token's group, a worker's `--group`). */
export const GROUP_RE = /^[a-z0-9][a-z0-9_-]{0,62}$/;

/** The group of jobs and takers that name none. */
export const DEFAULT_GROUP = 'default';

/** Checks a group name (TypeError naming `what` when it is not one). */
export function checkGroup(group: unknown, what = 'group'): string {
  if (typeof group !== 'string' || !GROUP_RE.test(group))
    throw new TypeError(`${what} must be 1–63 lowercase letters, digits, _ or - (a worker group)`);
  return group;
}

/** Checks a workspace id (TypeError naming `what` when it is not one). */
export function checkWorkspace(workspace: unknown, what = 'workspace'): string {
  if (typeof workspace !== 'string' || !WORKSPACE_RE.test(workspace))
    throw new TypeError(`${what} must be a workspace id`);
  return workspace;
}

/**
 * The BullMQ queue of one workspace's jobs for one worker group: `<base>/<workspace>/<group>`
 * (neither a workspace id nor a group has a `/`, so no two pairs share a name). Every queue of
 * a deployment is under the same prefix, so on a Cluster they all share its hash tag's slot.
 * A taker reads only its own queues: it never meets another workspace's or group's job. The
 * name is in the sealed record's associated data, so a message copied into another queue does
 * not open there.
 */
export function routedQueueName(base: string, workspace: string, group: string): string {
  if (typeof base !== 'string' || !/^[A-Za-z0-9_.-]{1,64}$/.test(base))
    throw new TypeError('name must be 1–64 letters, digits, _ . or -');
  return `${base}/${checkWorkspace(workspace)}/${checkGroup(group)}`;
}

/**
 * The sorted set of the fleet's heartbeats, one for every queue under `base`: member
 * `<workspace>/<group>/<taker id>`, score the last beat (ms). One read tells the whole fleet.
 */
export function fleetKey(prefix: string, base: string): string {
  return `${prefix}:${base}:fleet`;
}

/** A taker's member in the fleet set, for one of the queues it takes from. */
export function fleetMember(workspace: string, group: string, id: string): string {
  return `${workspace}/${group}/${id}`;
}

/** Live takers per `<workspace>/<group>`, from the fleet set's members. */
export function fleetCounts(members: readonly string[]): Map<string, number> {
  const counts = new Map<string, number>();
  for (const member of members) {
    const first = member.indexOf('/');
    const second = first < 0 ? -1 : member.indexOf('/', first + 1);
    if (second < 0) continue;
    const slot = member.slice(0, second);
    counts.set(slot, (counts.get(slot) ?? 0) + 1);
  }
  return counts;
}

/** How long a heartbeat counts: a taker beats every third of it. */
export const HEARTBEAT_TTL_MS = 15_000;

/**
 * What a queue message carries: the workspace, its BullMQ job id, its deadline (ms since the
 * epoch) in clear, and the job record sealed to exactly those (see sealed_job.ts). Nothing a
 * worker could take a viewer from unless it opens under the deployment secret.
 */
export interface QueueMessage {
  readonly workspace: string;
  readonly queueId: string;
  readonly deadline: number;
  readonly record: string;
}

export function isQueueMessage(data: unknown): data is QueueMessage {
  if (data === null || typeof data !== 'object') return false;
  const d = data as Record<string, unknown>;
  return (
    typeof d['workspace'] === 'string' &&
    typeof d['queueId'] === 'string' &&
    Number.isSafeInteger(d['deadline']) &&
    typeof d['record'] === 'string' &&
    Object.keys(d).length === 4
  );
}
