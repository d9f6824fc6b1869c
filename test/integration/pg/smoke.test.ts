import { expect, inject, it } from 'vitest';

it('has pg', () => {
  expect(inject('pgVersionNum')).toBeGreaterThan(150000);
});
