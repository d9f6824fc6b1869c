import { describe, expect, it } from 'vitest';
import { BackoffPoller } from '../../src/server/process/poll_backoff.js';

// The one background poller: a failure is reported once per backoff step, the first answer
// after failures once, and a round never overlaps another.
describe('BackoffPoller', () => {
  it('reports each failure with its growing pause, then the answer that ends them', async () => {
    const events: unknown[] = [];
    let down = 2;
    const poller = new BackoffPoller({
      periodMs: 100,
      poll: async () => {
        if (down-- > 0) throw new Error('connection refused');
      },
      failed: (_err, state) => events.push(state),
      answeredAgain: (failedPolls) => events.push({ answeredAgain: failedPolls }),
    });
    await poller.pollNow();
    await poller.pollNow();
    await poller.pollNow();
    await poller.pollNow();
    expect(events).toEqual([
      { failedPolls: 1, retryInMs: 200 },
      { failedPolls: 2, retryInMs: 400 },
      { answeredAgain: 2 },
    ]);
  });

  it('skips a round asked for while one runs', async () => {
    let rounds = 0;
    let finish: () => void = () => {};
    const poller = new BackoffPoller({
      periodMs: 100,
      poll: () => {
        rounds++;
        return new Promise<void>((resolve) => {
          finish = resolve;
        });
      },
      failed: () => {},
      answeredAgain: () => {},
    });
    const first = poller.pollNow();
    await poller.pollNow();
    finish();
    await first;
    expect(rounds).toBe(1);
    poller.stop();
  });
});
