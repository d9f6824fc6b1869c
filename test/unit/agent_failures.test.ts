import { describe, expect, it } from 'vitest';
import { failureOf } from '../../src/server/agents/agent_protocol.js';

// What an agent reports as a job's failure becomes the error the server answers with: our own
// codes keep their class and status, a statement's data exception is the caller's bad input
// (400, as in process, its text dropped: it may quote the value), anything else a 500.
describe('an agent-reported failure, as the server answers it', () => {
  it('one of our codes keeps its class and status', () => {
    expect(failureOf('E_NO_VIEWER', 'no viewer')).toMatchObject({
      code: 'E_NO_VIEWER',
      status: 403,
    });
  });

  it("a statement's data exception (SQLSTATE class 22) is E_INVALID_DATA, 400, without its text", () => {
    const err = failureOf('22021', 'invalid byte sequence for encoding "UTF8": 0x00 in em\u0000ea');
    expect(err).toMatchObject({ code: 'E_INVALID_DATA', status: 400 });
    expect(err.message).not.toContain('0x00');
  });

  it('another SQLSTATE or an unknown code is E_EXECUTOR_FAILED', () => {
    for (const code of ['42501', 'E_NOT_OURS', '']) {
      expect(failureOf(code, 'x')).toMatchObject({ code: 'E_EXECUTOR_FAILED', status: 500 });
    }
  });
});
