import { describe, expect, it } from 'vitest';
import { InvalidJobError } from '../../src/errors.js';
import { QueueKeys } from '../../src/queue/queue_seal.js';
import { OnceIds, openJobRecord, sealJob } from '../../src/queue/sealed_job.js';
import { makeJob } from '../helpers/jobs.js';

// A server of this version adds each queued job under a deduplication id of its own, its
// once-id, sealed in the record beside the origin: the replay guard a worker checks without a
// round trip (queue_claim.ts; BullMQ's side is tested on a real Redis in queue_core.test.ts).

const keys = new QueueKeys('a-deployment-secret-for-once-ids-00001');
const place = { prefix: 'vc', name: 'jobs/ws/default' };
const queueId = keys.queueId('flight');
const deadline = Date.now() + 60_000;
const job = makeJob({ viewer: 'alice@example.com', args: { n: 1 } });
const digest = 'ab'.repeat(32);

/** The record's fields, opened as any reader does (the associated data of sealed_job.ts). */
function fields(record: string): unknown[] {
  const bound = ['job record v1', place.prefix, place.name, 'ws', queueId, deadline];
  return JSON.parse(keys.openRecord(JSON.stringify(bound), record) ?? 'null') as unknown[];
}

/** A record as a server writes one, with slot 5 (the origin's) replaced by `origin`. */
function withOrigin(origin: unknown) {
  const base = sealJob(keys, place, job, 'app', queueId, deadline);
  const f = fields(base.record);
  f[5] = origin;
  const bound = ['job record v1', place.prefix, place.name, 'ws', queueId, deadline];
  return { ...base, record: keys.sealRecord(JSON.stringify(bound), JSON.stringify(f)) };
}

describe('once-ids', () => {
  it('are never the same twice, in one process or two', () => {
    const a = new OnceIds();
    const b = new OnceIds();
    const seen = new Set<string>();
    for (let i = 0; i < 1000; i++) {
      seen.add(a.next());
      seen.add(b.next());
    }
    expect(seen.size).toBe(2000);
  });

  it('travel sealed beside the origin (and the named key), in the slot every worker skips', () => {
    const once = new OnceIds().next();
    const named = { digest, fingerprint: 'fp' };
    const a = sealJob(keys, place, job, 'app', queueId, deadline, null, null, named, once);
    const b = sealJob(keys, place, job, 'app', queueId, deadline, null, null, null, once);
    const c = sealJob(keys, place, job, 'app', queueId, deadline);
    expect(openJobRecord(keys, place, a)).toMatchObject({ once, named });
    expect(openJobRecord(keys, place, b)).toMatchObject({ once, named: null });
    expect(openJobRecord(keys, place, c)).toMatchObject({ once: null, named: null });
    // A worker of an earlier version reads the same number of fields, and every slot but 5.
    const [fa, fc] = [fields(a.record), fields(c.record)];
    expect(fa.length).toBe(fc.length);
    expect(fa.filter((_, i) => i !== 5)).toEqual(fc.filter((_, i) => i !== 5));
  });

  it('a malformed one fails closed (E_INVALID_JOB), never as a record without one', () => {
    for (const once of [1, '', 'short', 'with space ok', 'x'.repeat(81), null, { id: 'abcdefgh' }])
      expect(() => openJobRecord(keys, place, withOrigin({ origin: 'app', once }))).toThrow(
        InvalidJobError,
      );
    expect(openJobRecord(keys, place, withOrigin({ origin: 'app', once: 'abcdefgh' }))?.once).toBe(
      'abcdefgh',
    );
    expect(() =>
      sealJob(keys, place, job, 'app', queueId, deadline, null, null, null, 'a b'),
    ).toThrow(TypeError);
  });

  it("say, beside them, that this version's server reads a large answer by reference", () => {
    const once = new OnceIds().next();
    const byRef = sealJob(keys, place, job, 'app', queueId, deadline, null, null, null, once, true);
    const inline = sealJob(keys, place, job, 'app', queueId, deadline, null, null, null, once);
    expect(openJobRecord(keys, place, byRef)).toMatchObject({ once, answersByRef: true });
    expect(openJobRecord(keys, place, inline)).toMatchObject({ once, answersByRef: false });
    // A record of an earlier version (the origin alone) is answered inline.
    expect(openJobRecord(keys, place, withOrigin('app'))?.answersByRef).toBe(false);
    // In slot 5 only: a worker of an earlier version reads every other slot as before.
    const [fa, fc] = [
      fields(byRef.record),
      fields(sealJob(keys, place, job, 'app', queueId, deadline).record),
    ];
    expect(fa.filter((_, i) => i !== 5)).toEqual(fc.filter((_, i) => i !== 5));
    // Anything but the flag itself fails closed.
    for (const bad of [true, 0, 2, '1', null, {}])
      expect(() => openJobRecord(keys, place, withOrigin({ origin: 'app', byRef: bad }))).toThrow(
        InvalidJobError,
      );
  });

  it("name, beside them, the server's reply id: where its worker answers it straight away", () => {
    const once = new OnceIds().next();
    const replyTo = 'r'.repeat(22);
    const direct = sealJob(
      keys,
      place,
      job,
      'app',
      queueId,
      deadline,
      null,
      null,
      null,
      once,
      true,
      replyTo,
    );
    expect(openJobRecord(keys, place, direct)).toMatchObject({ once, answersByRef: true, replyTo });
    // A server that takes no reply (or of an earlier version) names none.
    const plain = sealJob(keys, place, job, 'app', queueId, deadline, null, null, null, once, true);
    expect(openJobRecord(keys, place, plain)?.replyTo).toBeNull();
    expect(openJobRecord(keys, place, withOrigin('app'))?.replyTo).toBeNull();
    // In slot 5 only: a worker of an earlier version reads every other slot as before.
    const [fd, fp] = [fields(direct.record), fields(plain.record)];
    expect(fd.filter((_, i) => i !== 5)).toEqual(fp.filter((_, i) => i !== 5));
    // A reply id of any other form, or one without the once-id a reply is routed by, fails
    // closed; and no server writes one.
    for (const bad of ['short', 'with space in it ok', 'x'.repeat(65), 7, null, {}])
      expect(() =>
        openJobRecord(keys, place, withOrigin({ origin: 'app', once, reply: bad })),
      ).toThrow(InvalidJobError);
    expect(() => openJobRecord(keys, place, withOrigin({ origin: 'app', reply: replyTo }))).toThrow(
      InvalidJobError,
    );
    expect(() =>
      sealJob(keys, place, job, 'app', queueId, deadline, null, null, null, once, true, 'a b'),
    ).toThrow(TypeError);
  });
});
