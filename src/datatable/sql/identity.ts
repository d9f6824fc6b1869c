/**
 * The viewer's identity inside a data-table database (SPEC invariant 13), installed by the
 * library with its privileged connection and idempotent on PostgreSQL 15 and 18.
 *
 * A binding row names a *backend* — its pid and the client address and port of its socket, as
 * the lending connection sees them: the library's privileged side writes it when it lends a
 * connection as the viewer and deletes it before the connection goes back to its pool. Nobody
 * else has any privilege on the table. The two functions a policy calls are SECURITY DEFINER
 * with a fixed search_path and read only the row of the calling backend (pg_backend_pid,
 * inet_client_addr, inet_client_port: no catalog or statistics lookup, a few µs), so nothing a
 * runnable runs on its connection — SET, set_config, SET ROLE, RESET ROLE, DISCARD, NOTIFY —
 * changes what they return, and a second connection of its own has another pid and port. A row
 * left by a process that died is matched by no later backend unless both its pid and its client
 * port are reused; such rows are swept whenever a process installs. Behind a proxy that changes
 * the client address, nothing matches and the functions raise (fail closed).
 *
 * In a policy, call them as a scalar subquery — `provider_email = (select
 * viewer_cache.viewer_email())` — so Postgres evaluates them once per query, not once per row.
 */

/** SQLSTATE of reading the identity on a connection that carries none. */
export const NO_IDENTITY = 'VC401';
/** SQLSTATE of reading an attribute the viewer was not given. */
export const NO_ATTRIBUTE = 'VC402';
/** SQLSTATE of reading the email of an embed viewer whose assertion carries none. */
export const NO_EMAIL = 'VC403';

export const INSTALL = [
  'create schema if not exists viewer_cache',
  // Unlogged: bindings live as long as a lease; they need no WAL and no crash recovery.
  `create unlogged table if not exists viewer_cache.lease_identity (
     pid int primary key,
     client_addr inet,
     client_port int,
     email text not null,
     attributes jsonb not null default '{}'::jsonb
   )`,
  // An embed viewer's assertion may carry no email (tables made before embed viewers: NOT NULL).
  'alter table viewer_cache.lease_identity alter column email drop not null',
  'revoke all on viewer_cache.lease_identity from public',
  `create or replace function viewer_cache.viewer_email() returns text
     language plpgsql stable security definer
     set search_path = pg_catalog, pg_temp
   as $vc$
   declare
     bound boolean;
     found text;
   begin
     select true, i.email into bound, found
       from viewer_cache.lease_identity i
      where i.pid = pg_catalog.pg_backend_pid()
        and i.client_addr is not distinct from pg_catalog.inet_client_addr()
        and i.client_port is not distinct from pg_catalog.inet_client_port();
     if bound is null then
       raise exception 'this connection carries no viewer identity'
         using errcode = '${NO_IDENTITY}',
               hint = 'only a run with a viewer, connected with ?as=viewer, has one';
     end if;
     if found is null then
       raise exception 'this viewer has no email'
         using errcode = '${NO_EMAIL}',
               hint = 'an embed viewer has an email only when its host signed one';
     end if;
     return found;
   end
   $vc$`,
  `create or replace function viewer_cache.viewer_attribute(name text) returns text
     language plpgsql stable security definer
     set search_path = pg_catalog, pg_temp
   as $vc$
   declare
     bound jsonb;
   begin
     select i.attributes into bound
       from viewer_cache.lease_identity i
      where i.pid = pg_catalog.pg_backend_pid()
        and i.client_addr is not distinct from pg_catalog.inet_client_addr()
        and i.client_port is not distinct from pg_catalog.inet_client_port();
     if bound is null then
       raise exception 'this connection carries no viewer identity'
         using errcode = '${NO_IDENTITY}',
               hint = 'only a run with a viewer, connected with ?as=viewer, has one';
     end if;
     if not (bound ? name) or jsonb_typeof(bound -> name) = 'null' then
       raise exception 'the viewer was not given the attribute %', name
         using errcode = '${NO_ATTRIBUTE}';
     end if;
     return bound ->> name;
   end
   $vc$`,
  // A backend may drop its own binding (and only its own): the library calls this on the lent
  // connection itself when it is given back, beside DISCARD ALL, so a release costs no
  // privileged round trip. A runnable calling it only loses its own identity.
  `create or replace function viewer_cache.release_identity() returns void
     language sql volatile security definer
     set search_path = pg_catalog, pg_temp
   as $vc$
     delete from viewer_cache.lease_identity where pid = pg_catalog.pg_backend_pid()
   $vc$`,
  'revoke all on function viewer_cache.release_identity() from public',
  'grant execute on function viewer_cache.release_identity() to public',
  'revoke all on function viewer_cache.viewer_email() from public',
  'revoke all on function viewer_cache.viewer_attribute(text) from public',
  'grant usage on schema viewer_cache to public',
  'grant execute on function viewer_cache.viewer_email() to public',
  'grant execute on function viewer_cache.viewer_attribute(text) to public',
  // Rows of backends that are gone (a process died before it could unbind).
  `delete from viewer_cache.lease_identity i
    where not exists (select 1 from pg_catalog.pg_stat_activity a
                       where a.pid = i.pid
                         and a.client_port is not distinct from i.client_port)`,
];

/** Binds an identity to the backend with pid `$1` and client socket `$2`:`$3`. */
export const BIND = `
  insert into viewer_cache.lease_identity (pid, client_addr, client_port, email, attributes)
  values ($1, $2::inet, $3, $4, $5::jsonb)
  on conflict (pid) do update
     set client_addr = excluded.client_addr,
         client_port = excluded.client_port,
         email = excluded.email,
         attributes = excluded.attributes`;

export const UNBIND = 'delete from viewer_cache.lease_identity where pid = $1';

/**
 * What a viewer lease runs on its own connection when it is given back, in order (DISCARD ALL
 * cannot share a multi-statement query: it refuses to run in its implicit transaction).
 */
export const RESET_AND_RELEASE = ['select viewer_cache.release_identity()', 'discard all'] as const;
