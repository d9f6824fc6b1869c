import assert from 'node:assert/strict';
import { createViewerCache } from 'viewer-cache';

// What a hit's `result.value` is, in process memory: `values` chooses (docs/memory-store.md).
const orders = async () => ({ rows: [{ id: 1, region: 'emea', amount: 1200 }] });
const bob = { kind: 'app', session: { email: 'bob@acme.test' } } as const;
const run = { path: 'f/orders/list', args: { region: 'emea' }, origin: bob, ttl: '60s' };

for (const values of ['fresh', 'shared', 'cloned'] as const) {
  const cache = createViewerCache({ functions: { 'f/orders/list': orders }, values });
  await cache.run(run); // a miss: computed and stored
  const first = (await cache.run(run)).value as Awaited<ReturnType<typeof orders>>;
  const second = (await cache.run(run)).value as Awaited<ReturnType<typeof orders>>;
  if (values === 'shared') {
    // One deep-frozen value per entry, handed to every hit of that entry: no parse, no copy.
    assert.equal(second, first);
    assert.ok(Object.isFrozen(first.rows[0]));
  } else {
    // 'fresh' parses each hit, 'cloned' copies the entry's one parsed value: either way the
    // caller's own value, which it may change without the next hit seeing it.
    first.rows[0]!.amount = 0;
    assert.equal(second.rows[0]!.amount, 1200);
  }
  console.log(values, second.rows[0]);
  await cache.close();
}
