import { expect, inject, it } from 'vitest';

it('has redis', () => {
  expect(inject('redisUrl')).toMatch(/^redis:/);
});
