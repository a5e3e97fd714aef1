#!/usr/bin/env bash
# ensure-postgres.sh: make sure a PostgreSQL server is reachable and print its
# URL on stdout (everything else goes to stderr).
#
#   1. DATABASE_URL set: use it as is.
#   2. Something answers on 127.0.0.1:5432: use it (trust auth, user postgres).
#   3. Otherwise start the machine's Debian cluster if there is one, or
#      initdb a private one under .data/postgres (installing Debian's
#      postgresql package when the binaries are missing) on 127.0.0.1:5432.
set -euo pipefail

log() { echo "ensure-postgres: $*" >&2; }

if [ -n "${DATABASE_URL:-}" ]; then
  echo "$DATABASE_URL"
  exit 0
fi

here=$(cd "$(dirname "$0")/.." && pwd)
datadir="$here/.data/postgres"
# shellcheck source=pg-lib.sh
. "$here/scripts/pg-lib.sh"

# TLS over loopback only burns CPU on both ends (a server with ssl = on, as
# Debian's is, would otherwise get it from libpq's and pgx's sslmode=prefer).
URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"

wait_ready() {
  for _ in $(seq 1 60); do
    if pg_answers 5432; then return 0; fi
    sleep 0.5
  done
  return 1
}

# start_debian_cluster starts the machine's first Debian cluster, if any.
start_debian_cluster() {
  command -v pg_lsclusters >/dev/null 2>&1 && [ -n "$(pg_lsclusters -h 2>/dev/null)" ] || return 1
  read -r ver name _ < <(pg_lsclusters -h | head -1)
  log "starting the machine's PostgreSQL cluster $ver/$name"
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2 || true
  wait_ready
}

if pg_answers 5432; then
  echo "$URL"
  exit 0
fi
if start_debian_cluster; then
  echo "$URL"
  exit 0
fi

had_binaries=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | head -1 || true)
bindir=$(pg_bindir)
if [ -z "$had_binaries" ] && start_debian_cluster; then
  # The package created and started a cluster of its own. Debian's default
  # is peer auth on the socket and md5 on TCP: allow local trust for this
  # development cluster.
  read -r ver name _ < <(pg_lsclusters -h | head -1)
  hba=/etc/postgresql/"$ver"/"$name"/pg_hba.conf
  if ! grep -q "ffreconcile" "$hba"; then
    sed -i '1i host all all 127.0.0.1/32 trust # ffreconcile dev\nhost all all ::1/128 trust # ffreconcile dev' "$hba"
    pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" reload >&2
  fi
  echo "$URL"
  exit 0
fi

# A private cluster under .data/postgres.
if [ ! -f "$datadir/PG_VERSION" ]; then
  log "initialising a private cluster in $datadir"
  mkdir -p "$datadir"
  [ "$(id -u)" -eq 0 ] && chown postgres "$datadir"
  chmod 700 "$datadir"
  pg_run_as "$bindir/initdb" -D "$datadir" -U postgres --auth=trust >&2
  cat >>"$datadir/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = 5432
unix_socket_directories = ''
max_locks_per_transaction = 256
CONF
fi
log "starting the private cluster in $datadir"
pg_run_as "$bindir/pg_ctl" -D "$datadir" -l "$datadir/server.log" -w start >&2
wait_ready
echo "$URL"
