import { describe, expect, it } from 'vitest';
import type { Job } from '../../src/index.js';
import { redactErrorText, valuesOf } from '../../src/server/http/run_failure_log.js';

// A failed run's log line carries the error's text with the run's own values taken out: an
// args value or an embed attribute a runnable wrote into its message, quoted or not, never
// reaches the log in clear (SPEC invariant 24).

const job = {
  id: 'j1',
  workspace: 'demo',
  runnable: { path: 'f/orders/list', hash: 'h' },
  args: { region: 'emea', filter: { customer: 'Acme Widgets' }, limit: 7, tags: ['vip-tier'] },
  perms: {
    email: 'publisher@example.com',
    endUserEmail: null,
    embed: { app: 'clinics', attributes: { health_system: 'North' }, email: null },
  },
} as unknown as Job;

describe('a failed run’s error text', () => {
  it('loses every value of the run, quoted or not', () => {
    const text = redactErrorText(
      'no orders for emea at Acme Widgets (tag vip-tier, system North, limit 7)',
      valuesOf(job),
    );
    for (const value of ['emea', 'Acme Widgets', 'vip-tier', 'North']) {
      expect(text).not.toContain(value);
    }
    expect(text).toContain('no orders for');
  });

  it('keeps the shape of a Postgres refusal', () => {
    expect(redactErrorText('permission denied for table orders', valuesOf(job))).toBe(
      'permission denied for table orders',
    );
  });
});
