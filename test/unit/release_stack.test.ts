import { describe, expect, it } from 'vitest';
import { ReleaseStack } from '../../src/server/start/release_stack.js';

describe('ReleaseStack', () => {
  it('runs the steps last-pushed first, once, however often release is called', async () => {
    const ran: string[] = [];
    const stack = new ReleaseStack();
    for (const name of ['database', 'datatables', 'pool'])
      stack.push(async () => void ran.push(name));
    const first = stack.release();
    const second = stack.release();
    await Promise.all([first, second]);
    await stack.release();
    expect(ran).toEqual(['pool', 'datatables', 'database']);
    expect(second).toBe(first);
  });

  it('runs every step though one fails, each after the one before finished', async () => {
    const ran: string[] = [];
    const stack = new ReleaseStack();
    stack.push(async () => void ran.push('first'));
    stack.push(async () => {
      throw new Error('already closed');
    });
    stack.push(
      () => new Promise<void>((resolve) => setImmediate(() => resolve(void ran.push('slow')))),
    );
    await stack.release();
    expect(ran).toEqual(['slow', 'first']);
  });

  it('runs a step pushed after release began at once rather than leaving it open', async () => {
    const stack = new ReleaseStack();
    await stack.release();
    let closed = false;
    stack.push(async () => {
      closed = true;
    });
    expect(closed).toBe(true);
    expect(stack.released).toBe(true);
  });
});
