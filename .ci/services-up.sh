#!/usr/bin/env bash
# Makes sure the services the tests need are up, and prints `export` lines for them:
# - Redis on 127.0.0.1:6379 (the machine's; started the way the machine starts it if it is down);
# - a private PostgreSQL cluster from the machine's own binaries (15 on Debian 12) that enforces
#   scram-sha-256 over TCP, on 127.0.0.1:$PG_PORT. The machine's own 5432 uses trust auth, which
#   would let any password through and make the login tests meaningless.
# Usage: eval "$(bash .ci/services-up.sh)"
set -euo pipefail
RUN_DIR=${RUN_DIR:-${TMPDIR:-/tmp}/viewer-cache-ci}
PG_PORT=${PG_PORT:-55432}
PG_SUPERPASS=${PG_SUPERPASS:-ci-superuser-pw}

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
# The audit's HTML report is tested in a real browser (test/integration/pg/audit_leaky.test.ts).
[ -x /usr/bin/chromium ] || need+=(chromium)
ls -d /usr/lib/postgresql/*/bin >/dev/null 2>&1 || need+=(postgresql)
# The PgBouncer suite starts private instances of it (test/helpers/pgbouncer.ts).
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null 2>&1 || need+=(pgbouncer)
if ((${#need[@]})); then
  apt-get update >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >&2
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; then
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log >&2
  for _ in $(seq 50); do redis-cli -p 6379 ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
fi

PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
if [ "$(id -u)" = 0 ]; then
  id postgres >/dev/null 2>&1 || useradd --system --user-group --create-home --shell /bin/bash postgres
  AS_PG=(runuser -u postgres --)
else
  AS_PG=()
fi
mkdir -p "$RUN_DIR/pg"; chmod 700 "$RUN_DIR/pg"
[ "$(id -u)" = 0 ] && chown postgres:postgres "$RUN_DIR/pg"
if [ ! -f "$RUN_DIR/pg/data/PG_VERSION" ]; then
  pwfile=$(mktemp); printf '%s\n' "$PG_SUPERPASS" > "$pwfile"
  [ "$(id -u)" = 0 ] && chown postgres "$pwfile"
  "${AS_PG[@]}" "$PGBIN/initdb" -D "$RUN_DIR/pg/data" -U postgres --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 -N >&2
  rm -f "$pwfile"
fi
if ! "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$RUN_DIR/pg/data" status >/dev/null 2>&1; then
  "${AS_PG[@]}" "$PGBIN/pg_ctl" -D "$RUN_DIR/pg/data" -l "$RUN_DIR/pg/pg.log" -w -t 30 \
    -o "-p $PG_PORT -h 127.0.0.1 -k $RUN_DIR/pg -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" start >&2
fi

echo "export DATABASE_URL=postgres://postgres:${PG_SUPERPASS}@127.0.0.1:${PG_PORT}/postgres"
echo "export REDIS_URL=redis://127.0.0.1:6379"
