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

# TLS over loopback only burns CPU on both ends (a server with ssl = on, as
# Debian's is, would otherwise get it from libpq's and pgx's sslmode=prefer):
# about 7 % of the machine's CPU per row in the lateness benchmark.
URL="postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable"
here=$(cd "$(dirname "$0")/.." && pwd)
datadir="$here/.data/postgres"

answers() { (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; }

wait_ready() {
  for _ in $(seq 1 60); do
    if answers; then return 0; fi
    sleep 0.5
  done
  return 1
}

if answers; then
  echo "$URL"
  exit 0
fi

# The machine's own cluster (Debian layout), if any.
if command -v pg_lsclusters >/dev/null 2>&1 && [ -n "$(pg_lsclusters -h 2>/dev/null)" ]; then
  read -r ver name _ < <(pg_lsclusters -h | head -1)
  log "starting the machine's PostgreSQL cluster $ver/$name"
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2 || true
  if wait_ready; then echo "$URL"; exit 0; fi
  log "cluster $ver/$name did not come up; falling back to a private cluster"
fi

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bindir" ]; then
  log "PostgreSQL binaries are missing; installing Debian's postgresql package"
  if [ "$(id -u)" -ne 0 ]; then
    log "need root to apt-get install postgresql; install it or set DATABASE_URL"
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  # The package creates and starts a cluster of its own.
  if command -v pg_lsclusters >/dev/null 2>&1 && [ -n "$(pg_lsclusters -h 2>/dev/null)" ]; then
    read -r ver name _ < <(pg_lsclusters -h | head -1)
    pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start >&2 || true
    if wait_ready; then
      # Debian's default is peer auth on the socket and md5 on TCP: allow
      # local trust for this development cluster.
      hba=$(ls /etc/postgresql/"$ver"/"$name"/pg_hba.conf)
      if ! grep -q "ffreconcile" "$hba"; then
        sed -i '1i host all all 127.0.0.1/32 trust # ffreconcile dev\nhost all all ::1/128 trust # ffreconcile dev' "$hba"
        pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" reload >&2
      fi
      echo "$URL"; exit 0
    fi
  fi
fi

# A private cluster under .data/postgres. initdb refuses to run as root, so
# run it as the postgres user when we are root.
run_as() {
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir "$datadir" postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}
if [ ! -f "$datadir/PG_VERSION" ]; then
  log "initialising a private cluster in $datadir"
  mkdir -p "$datadir"
  [ "$(id -u)" -eq 0 ] && chown -R postgres "$here/.data" 2>/dev/null || true
  run_as "$bindir/initdb" -D "$datadir" -U postgres --auth=trust >&2
  cat >>"$datadir/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = 5432
unix_socket_directories = '$datadir'
max_locks_per_transaction = 256
CONF
fi
log "starting the private cluster in $datadir"
run_as "$bindir/pg_ctl" -D "$datadir" -l "$datadir/server.log" -w start >&2
wait_ready
echo "$URL"
