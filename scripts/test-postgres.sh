#!/usr/bin/env bash
# test-postgres.sh start|stop: the PostgreSQL server `make test` runs against.
#
#   start    print the server's URL on stdout (everything else goes to
#            stderr): TEST_DATABASE_URL when set; otherwise a private cluster
#            (in /dev/shm or .data/test-postgres, below), initialised on first
#            use and started on a free port, tuned for tests.
#   stop     drop the test databases left offered for reuse, then stop the
#            private cluster.
#   start run / stop run (the Makefile's): the same, but `stop run` stops
#            the cluster only if `start run` started it; one already running
#            (started by hand, used by another run) is left running.
#   datadir  print the private cluster's data directory.
#
# Why a private cluster. Tests only need a real PostgreSQL, not a durable
# one, and they run side by side: every test owns a database, and a
# statement over a 256-way partitioned table takes ~1,000-2,300 lock slots,
# more than a default server's lock table (max_locks_per_transaction 64 x
# max_connections 100) can give several packages at once. So the cluster
# runs with fsync off and a lock table of max_locks_per_transaction 1024 x
# max_connections 500. It never touches a server already running on the
# machine (127.0.0.1:5432 included).
#
# Where its data lives. A test database is a clone of a template of ~25,000
# relations (~250 MB of mostly empty files), created for a test and dropped
# after it, or emptied and handed to a later test (internal/testdb/reuse.go):
# on ext4 a clone is ~4.7 s of mostly kernel time, on tmpfs ~0.7 s
# (measured on this 2-core machine). So the cluster lives in /dev/shm when
# that is a tmpfs with room (MIN_SHM_GB free; the suite peaked at 5.3 GB),
# keyed by this checkout's path so two clones never share one, and under
# .data/test-postgres otherwise (or when FF_TEST_PGDATA names a directory).
# Its template databases (testdb builds one per DDL version) stay there for
# the next run; `make clean` removes them.
#
# With TEST_DATABASE_URL pointing at a server of default settings, run the
# tests one at a time: `make test TEST_P=1 TEST_PARALLEL=1`.
set -euo pipefail

log() { echo "test-postgres: $*" >&2; }

here=$(cd "$(dirname "$0")/.." && pwd)

MIN_SHM_GB=${MIN_SHM_GB:-12}
shm_dir() {
  local key free_kb
  key=$(printf '%s' "$here" | cksum | cut -d' ' -f1)
  [ -d /dev/shm ] && [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] || return 1
  if [ -f "/dev/shm/ffreconcile-test-$key/PG_VERSION" ]; then
    echo "/dev/shm/ffreconcile-test-$key"
    return 0
  fi
  free_kb=$(df -Pk /dev/shm | awk 'NR==2 {print $4}')
  [ "$free_kb" -ge $((MIN_SHM_GB * 1024 * 1024)) ] || return 1
  echo "/dev/shm/ffreconcile-test-$key"
}
if [ -n "${FF_TEST_PGDATA:-}" ]; then
  datadir=$FF_TEST_PGDATA
elif ! datadir=$(shm_dir); then
  datadir="$here/.data/test-postgres"
fi

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
  # Started for this run (the Makefile's `start run`): its stop stops it.
  # Started by hand (`start`), or found running, it is left running: other
  # runs (another terminal, a helper with TEST_DATABASE_URL) may use it.
  if [ "${1:-}" = run ]; then
    touch "$datadir/ffreconcile-stop-after-run"
  fi
  url "$port"
}

# drop_offered URL: drop the test databases testdb emptied and offered for
# reuse (ffr_f_*, see internal/testdb/reuse.go) that no test claimed before
# the run ended: ~200 MB each.
drop_offered() {
  local psql names n
  # Never pg_bindir here: with TEST_DATABASE_URL the machine may have no
  # server binaries, and stop must not install any.
  psql=$(command -v psql || ls -d /usr/lib/postgresql/*/bin/psql 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$psql" ]; then
    log "no psql to drop the test databases offered for reuse (ffr_f_*); a later stop with psql drops them"
    return 0
  fi
  if ! names=$("$psql" "$1" -XAtqc "SELECT datname FROM pg_database WHERE starts_with(datname, 'ffr_f_')"); then
    log "could not list the test databases offered for reuse (ffr_f_*); a later stop drops them"
    return 0
  fi
  for n in $names; do
    "$psql" "$1" -Xqc "DROP DATABASE IF EXISTS \"$n\" WITH (FORCE)" >/dev/null || log "could not drop $n"
  done
}

stop() {
  if [ -n "${TEST_DATABASE_URL:-}" ]; then
    drop_offered "$TEST_DATABASE_URL"
    return
  fi
  [ -f "$datadir/PG_VERSION" ] || return 0
  local bin
  bin=$(pg_bindir)
  if pg_run_as "$bin/pg_ctl" -D "$datadir" status >/dev/null 2>&1; then
    drop_offered "$(url "$(sed -n 4p "$datadir/postmaster.pid")")"
    if [ ! -f "$datadir/ffreconcile-stop-after-run" ] && [ "${1:-}" = run ]; then
      log "test cluster left running (it was running before this run)"
      return
    fi
    pg_run_as "$bin/pg_ctl" -D "$datadir" -m fast -w stop >/dev/null
    rm -f "$datadir/ffreconcile-stop-after-run"
    log "test cluster stopped"
  fi
}

case "${1:-}" in
  start) start "${2:-}" ;;
  stop) stop "${2:-}" ;;
  datadir) echo "$datadir" ;;
  *) echo "usage: $0 start|stop|datadir" >&2; exit 2 ;;
esac
