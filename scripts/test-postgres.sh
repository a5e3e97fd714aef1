#!/usr/bin/env bash
# test-postgres.sh start|stop: the PostgreSQL server `make test` runs against.
#
#   start  print the server's URL on stdout (everything else goes to stderr):
#          TEST_DATABASE_URL when set; otherwise a private cluster under
#          .data/test-postgres, initialised on first use and started on a free
#          port, tuned for tests (see below).
#   stop   stop the private cluster, if this script started it.
#
# Why a private cluster. Tests only need a real PostgreSQL, not a durable
# one, and they run side by side: every test owns a database, and a
# statement over a 256-way partitioned table takes ~1,000-2,300 lock slots,
# more than a default server's lock table (max_locks_per_transaction 64 x
# max_connections 100) can give several packages at once. So the cluster
# runs with fsync off and a lock table of max_locks_per_transaction 1024 x
# max_connections 500. It never touches a server already running on the
# machine (127.0.0.1:5432 included), and its data (the template database
# testdb builds once per DDL version) stays under .data/test-postgres for
# the next run; `make clean` removes it.
#
# With TEST_DATABASE_URL pointing at a server of default settings, run the
# tests one at a time: `make test TEST_P=1 TEST_PARALLEL=1`.
set -euo pipefail

log() { echo "test-postgres: $*" >&2; }

here=$(cd "$(dirname "$0")/.." && pwd)
datadir="$here/.data/test-postgres"

# shellcheck source=pg-lib.sh
. "$here/scripts/pg-lib.sh"

url() { echo "postgres://postgres@127.0.0.1:$1/postgres?sslmode=disable"; }

start() {
  if [ -n "${TEST_DATABASE_URL:-}" ]; then
    echo "$TEST_DATABASE_URL"
    return
  fi
  local bin port
  bin=$(pg_bindir)
  if [ ! -f "$datadir/PG_VERSION" ]; then
    log "initialising a private test cluster in $datadir"
    rm -rf "$datadir"
    mkdir -p "$datadir"
    [ "$(id -u)" -eq 0 ] && chown postgres "$datadir"
    chmod 700 "$datadir"
    pg_run_as "$bin/initdb" -D "$datadir" -U postgres --auth=trust --no-sync >/dev/null
    cat >>"$datadir/postgresql.conf" <<'CONF'
# ffreconcile test cluster: throwaway data, many tests at once.
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = off
synchronous_commit = off
full_page_writes = off
max_connections = 500
max_locks_per_transaction = 1024
shared_buffers = 256MB
max_wal_size = 4GB
logging_collector = off
CONF
  fi
  if pg_run_as "$bin/pg_ctl" -D "$datadir" status >/dev/null 2>&1; then
    port=$(sed -n 4p "$datadir/postmaster.pid")
    log "test cluster already running on port $port"
    url "$port"
    return
  fi
  port=55432
  while pg_answers "$port"; do port=$((port + 1)); done
  log "starting the test cluster on 127.0.0.1:$port"
  if ! pg_run_as "$bin/pg_ctl" -D "$datadir" -l "$datadir/server.log" -o "-p $port" -w -t 60 start >/dev/null; then
    log "the test cluster did not start; its log:"
    tail -20 "$datadir/server.log" >&2 || true
    exit 1
  fi
  url "$port"
}

stop() {
  [ -n "${TEST_DATABASE_URL:-}" ] && return
  [ -f "$datadir/PG_VERSION" ] || return 0
  local bin
  bin=$(pg_bindir)
  if pg_run_as "$bin/pg_ctl" -D "$datadir" status >/dev/null 2>&1; then
    pg_run_as "$bin/pg_ctl" -D "$datadir" -m fast -w stop >/dev/null
    log "test cluster stopped"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
