/**
 * The viewer's identity inside a data-table database (SPEC invariant 13), installed by the
 * library with its privileged connection and idempotent on PostgreSQL 15 and 18.
 *
 * Two pieces, so that binding a viewer costs no write and no round trip of its own:
 * - **The lease epoch**: the session's `currval` of the sequence `viewer_cache.lease_seq`. The
 *   library calls `next_lease()` on the lent connection after each session reset (after the
 *   run's result is out) and reads the epoch it returns. Sequence values are unique across
 *   sessions; only the SECURITY DEFINER function can draw one, only the reading functions can
 *   see the session's value, and a session reset (DISCARD SEQUENCES) forgets it. Nothing is
 *   written to a table.
 * - **The binding**: three session settings the library sets from the lent connection,
 *   pipelined in front of the run's first statement: the viewer's email, attributes, and an
 *   HMAC-SHA-256 over them, the backend (pid, client port) and the current epoch, under a
 *   random key only the library's privileged side can read (`binding_key`).
 *
 * The functions a policy calls are SECURITY DEFINER with a fixed search_path: they recompute
 * the MAC from the settings, what the *calling* backend is (pg_backend_pid, inet_client_port)
 * and its epoch, and raise unless it matches. So a runnable that writes the settings itself
 * (`SET`, `set_config`) has no key to sign with; one that copies its binding to a second
 * connection meets another pid, port and epoch; one that keeps a binding for a later lease of
 * the same backend meets a newer epoch; and one that clears them (RESET ALL, DISCARD ALL,
 * DISCARD SEQUENCES, or next_lease() itself) only loses its own identity. Behind a proxy that
 * changes the client port, the MAC does not match and the functions raise (fail closed).
 *
 * Through a transaction pooler (`transactionPooler`) a backend serves another client after every
 * transaction, so the binding is made per transaction instead: BIND_TRANSACTION, sent in front
 * of each transaction's first statement, sets the settings transaction-locally with a MAC that
 * sign_transaction computes (from a short-lived token the library signed) over the backend, its
 * client port and the transaction's start (TRANSACTION_MESSAGE, marked by a leading `t`). It is
 * void once the transaction ends; no epoch is drawn.
 *
 * In a policy, call them as a scalar subquery — `provider_email = (select
 * viewer_cache.viewer_email())` — so Postgres evaluates them once per query, not once per row.
 */
import { NO_ATTRIBUTE, NO_EMAIL, NO_IDENTITY } from '../../../pg/sqlstate.js';

/** The session settings that carry a binding (see ViewerIdentities.binding). */
export const SETTING = {
  email: 'viewer_cache.viewer_email',
  attributes: 'viewer_cache.viewer_attributes',
  mac: 'viewer_cache.viewer_mac',
} as const;

/** HMAC-SHA-256 of `message` (bytea) from the key's two pads in `k`. */
const hmac = (message: string) =>
  `pg_catalog.sha256(k.outer_pad || pg_catalog.sha256(k.inner_pad || pg_catalog.convert_to(${message}, 'UTF8')))`;

const RAISE_NO_IDENTITY = `raise exception 'this connection carries no viewer identity'
         using errcode = '${NO_IDENTITY}',
               hint = 'only a run with a viewer, connected with ?as=viewer, has one'`;

/**
 * What a transaction binding signs (see sign_transaction): the calling backend, its client port
 * and the start of the current transaction in microseconds, then the email setting and the
 * attributes. A copy meets another backend, or a later transaction of the same one.
 */
const TRANSACTION_MESSAGE = `pg_catalog.concat_ws(E'\\n', 'txn', pg_catalog.pg_backend_pid(),
  coalesce(pg_catalog.inet_client_port()::text, ''),
  (extract(epoch from pg_catalog.transaction_timestamp()) * 1000000)::bigint,
  pg_catalog.octet_length(e), e, a)`;

/**
 * Declarations and checks shared by the two reading functions: on success `e` holds the email
 * setting ('=' and the email, or '-' for none) and `a` the attributes' JSON text.
 */
const VERIFY_DECLARE = `
     e text := pg_catalog.current_setting('${SETTING.email}', true);
     a text := pg_catalog.current_setting('${SETTING.attributes}', true);
     m text := pg_catalog.current_setting('${SETTING.mac}', true);
     epoch bigint;
     k record;`;
const VERIFY = `
     if e is null or a is null or m is null or m !~ '^t?[0-9a-f]{64}$' then
       ${RAISE_NO_IDENTITY};
     end if;
     select b.inner_pad, b.outer_pad into k from viewer_cache.binding_key b;
     if k.inner_pad is null then
       ${RAISE_NO_IDENTITY};
     end if;
     if pg_catalog.left(m, 1) = 't' then
       -- A transaction binding (through a transaction pooler): valid in its own transaction only.
       -- The MACs are compared through one more hash: the timing says nothing about the bytes.
       if pg_catalog.sha256(${hmac(TRANSACTION_MESSAGE)}) <> pg_catalog.sha256(pg_catalog.decode(pg_catalog.substr(m, 2), 'hex')) then
         ${RAISE_NO_IDENTITY};
       end if;
     else
       begin
         epoch := pg_catalog.currval('viewer_cache.lease_seq');
       exception when object_not_in_prerequisite_state then
         ${RAISE_NO_IDENTITY};
       end;
       if pg_catalog.sha256(${hmac(
         `pg_catalog.concat_ws(E'\n', 'viewer', pg_catalog.pg_backend_pid(),
            coalesce(pg_catalog.inet_client_port()::text, ''), epoch,
            pg_catalog.octet_length(e), e, a)`,
       )}) <> pg_catalog.sha256(pg_catalog.decode(m, 'hex')) then
         ${RAISE_NO_IDENTITY};
       end if;
     end if;`;

export const INSTALL = [
  'create schema if not exists viewer_cache',
  // Before 0.2 a binding was a row written by the privileged side for every lease.
  'drop function if exists viewer_cache.release_identity()',
  'drop table if exists viewer_cache.lease_identity',
  'create sequence if not exists viewer_cache.lease_seq as bigint',
  'revoke all on sequence viewer_cache.lease_seq from public',
  // HMAC-SHA-256 with a 64-byte key, kept as its two padded halves (key xor ipad, key xor
  // opad) so that SQL needs only sha256(): MAC = sha256(outer || sha256(inner || message)).
  `create table if not exists viewer_cache.binding_key (
     singleton boolean primary key default true check (singleton),
     inner_pad bytea not null check (octet_length(inner_pad) = 64),
     outer_pad bytea not null check (octet_length(outer_pad) = 64)
   )`,
  'revoke all on viewer_cache.binding_key from public',
  `create or replace function viewer_cache.viewer_email() returns text
     language plpgsql stable security definer
     set search_path = pg_catalog, pg_temp
   as $vc$
   declare${VERIFY_DECLARE}
   begin${VERIFY}
     if e = '-' then
       raise exception 'this viewer has no email'
         using errcode = '${NO_EMAIL}',
               hint = 'an embed viewer has an email only when its host signed one';
     end if;
     return pg_catalog.substr(e, 2);
   end
   $vc$`,
  `create or replace function viewer_cache.viewer_attribute(name text) returns text
     language plpgsql stable security definer
     set search_path = pg_catalog, pg_temp
   as $vc$
   declare${VERIFY_DECLARE}
     bound jsonb;
   begin${VERIFY}
     bound := a::jsonb;
     if not (bound ? name) or jsonb_typeof(bound -> name) = 'null' then
       raise exception 'the viewer was not given the attribute %', name
         using errcode = '${NO_ATTRIBUTE}';
     end if;
     return bound ->> name;
   end
   $vc$`,
  // Called on the lent connection after every session reset: the session's next epoch.
  // Anyone may call it; doing so only voids the caller's own binding.
  `create or replace function viewer_cache.next_lease() returns bigint
     language sql volatile security definer
     set search_path = pg_catalog, pg_temp
   as $vc$ select pg_catalog.nextval('viewer_cache.lease_seq') $vc$`,
  // Through a transaction pooler: turns a binding the library signed for the viewer (a MAC over
  // `e`, `a` and an expiry, in ms since the epoch) into the MAC of a binding for the calling
  // transaction (TRANSACTION_MESSAGE). Anyone may call it; without the key's MAC it raises.
  `create or replace function viewer_cache.sign_transaction(e text, a text, expires bigint, m text)
     returns text
     language plpgsql volatile security definer
     set search_path = pg_catalog, pg_temp
   as $vc$
   declare
     k record;
   begin
     if e is null or a is null or expires is null or m is null or m !~ '^[0-9a-f]{64}$' then
       ${RAISE_NO_IDENTITY};
     end if;
     select b.inner_pad, b.outer_pad into k from viewer_cache.binding_key b;
     if k.inner_pad is null or pg_catalog.sha256(${hmac(
       `pg_catalog.concat_ws(E'\n', 'lease', expires, pg_catalog.octet_length(e), e, a)`,
     )}) <> pg_catalog.sha256(pg_catalog.decode(m, 'hex'))
        or expires < (extract(epoch from pg_catalog.clock_timestamp()) * 1000)::bigint then
       ${RAISE_NO_IDENTITY};
     end if;
     return 't' || pg_catalog.encode(${hmac(TRANSACTION_MESSAGE)}, 'hex');
   end
   $vc$`,
  'revoke all on function viewer_cache.sign_transaction(text, text, bigint, text) from public',
  'grant execute on function viewer_cache.sign_transaction(text, text, bigint, text) to public',
  'revoke all on function viewer_cache.next_lease() from public',
  'grant execute on function viewer_cache.next_lease() to public',
  'revoke all on function viewer_cache.viewer_email() from public',
  'revoke all on function viewer_cache.viewer_attribute(text) from public',
  'grant usage on schema viewer_cache to public',
  'grant execute on function viewer_cache.viewer_email() to public',
  'grant execute on function viewer_cache.viewer_attribute(text) to public',
];

/**
 * What INSTALL leaves behind, as one text: the functions (body, owner rights, settings, grants),
 * the schema's and the sequence's and key table's grants, and the absence of what it drops.
 * Equal to the text recorded after the last install (and INSTALL unchanged), INSTALL is skipped:
 * its CREATE OR REPLACE and GRANTs, however idempotent, are rule changes to the database's
 * event trigger (every process starting would make every entry of its data tables miss).
 */
export const INSTALLED_STATE = `
  select concat_ws('|',
    (select string_agg(concat_ws(':', p.proname, p.prosecdef, p.proconfig::text,
                                 p.proacl::text, md5(p.prosrc)), ',' order by p.proname)
       from pg_catalog.pg_proc p
      where p.pronamespace = pg_catalog.to_regnamespace('viewer_cache')),
    (select n.nspacl::text from pg_catalog.pg_namespace n where n.nspname = 'viewer_cache'),
    (select coalesce(c.relacl::text, '') from pg_catalog.pg_class c
      where c.oid = pg_catalog.to_regclass('viewer_cache.lease_seq')),
    (select coalesce(c.relacl::text, '') from pg_catalog.pg_class c
      where c.oid = pg_catalog.to_regclass('viewer_cache.binding_key')),
    pg_catalog.to_regclass('viewer_cache.lease_identity')::text) as state`;

/** Whether an install was recorded here (the table exists). */
export const INSTALL_RECORDED =
  "select pg_catalog.to_regclass('viewer_cache.identity_install') is not null as recorded";

/** The install text and state recorded by the last install. */
export const READ_INSTALLED = 'select install, state from viewer_cache.identity_install';

export const RECORD_INSTALLED = [
  `create table if not exists viewer_cache.identity_install (
     singleton boolean primary key default true check (singleton),
     install text not null,
     state text not null
   )`,
  'revoke all on viewer_cache.identity_install from public',
];

export const STORE_INSTALLED = `
  insert into viewer_cache.identity_install (install, state) values ($1, $2)
  on conflict (singleton) do update set install = excluded.install, state = excluded.state`;

/** Stores a new binding key unless the database has one (`$1` inner pad, `$2` outer pad). */
export const STORE_KEY = `
  insert into viewer_cache.binding_key (inner_pad, outer_pad) values ($1, $2)
  on conflict (singleton) do nothing`;

export const READ_KEY = 'select inner_pad, outer_pad from viewer_cache.binding_key';

/** Draws the calling session's next epoch (run after every session reset). */
export const NEXT_LEASE = 'select viewer_cache.next_lease() as epoch';

/** Sets the binding on the calling backend: `$1` email setting, `$2` attributes, `$3` MAC. */
export const BIND = `select pg_catalog.set_config('${SETTING.email}', $1, false),
  pg_catalog.set_config('${SETTING.attributes}', $2, false),
  pg_catalog.set_config('${SETTING.mac}', $3, false)`;

/**
 * Binds the viewer for the calling transaction only (through a transaction pooler): `$1` email
 * setting, `$2` attributes, `$3` expiry (ms), `$4` the library's MAC over them. Transaction-local
 * settings: void when the transaction ends, and the MAC is the transaction's own.
 */
export const BIND_TRANSACTION = `select pg_catalog.set_config('${SETTING.email}', $1, true),
  pg_catalog.set_config('${SETTING.attributes}', $2, true),
  pg_catalog.set_config('${SETTING.mac}', viewer_cache.sign_transaction($1, $2, $3::bigint, $4), true)`;
