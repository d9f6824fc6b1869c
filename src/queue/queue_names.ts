/**
 * The queue's defaults, shared by servers and workers. The prefix is a Redis Cluster hash tag:
 * every key of the queue (and the workers' heartbeats) lands in one slot, which BullMQ's scripts
 * need on a Cluster, and it is the same on a single node.
 */
export const QUEUE_DEFAULTS = Object.freeze({
  prefix: '{viewer-cache}',
  name: 'jobs',
});

/** The sorted set of worker heartbeats (member: worker id, score: last beat in ms). */
export function heartbeatKey(prefix: string, name: string): string {
  return `${prefix}:${name}:workers`;
}

/** How long a heartbeat counts: a worker beats every third of it. */
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
