import type pg from 'pg';

/**
 * Runs `fn` in a transaction on `client`: `begin`, then `commit` when `fn` resolves (its value
 * is returned), `rollback` when it throws (the error is rethrown; a failed rollback is ignored:
 * the connection is usually what broke, and the caller's error says more). The client stays the
 * caller's to release. `snapshot: true` reads from one snapshot, writing nothing (repeatable
 * read, read only): several reads that must agree with each other.
 */
export async function withTransaction<T>(
  client: pg.ClientBase,
  fn: (client: pg.ClientBase) => Promise<T>,
  options: { readonly snapshot?: boolean } = {},
): Promise<T> {
  await client.query(
    options.snapshot === true
      ? 'begin transaction isolation level repeatable read read only'
      : 'begin',
  );
  try {
    const value = await fn(client);
    await client.query('commit');
    return value;
  } catch (err) {
    await client.query('rollback').catch(() => {});
    throw err;
  }
}
