# pg-lib.sh: shell functions shared by ensure-postgres.sh and
# test-postgres.sh. Source it; it defines functions only.

# pg_run_as runs a command as the postgres user when we are root (initdb and
# postgres refuse to run as root), creating that user if the machine has
# none, and as ourselves otherwise.
pg_run_as() {
  if [ "$(id -u)" -eq 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# pg_bindir prints the directory of the newest PostgreSQL server binaries,
# installing Debian's postgresql package first when there are none (which
# needs root). It logs through the caller's log function.
pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
  if [ -z "$d" ] && command -v pg_ctl >/dev/null 2>&1; then
    d=$(dirname "$(command -v pg_ctl)")
  fi
  if [ -z "$d" ]; then
    log "PostgreSQL binaries are missing; installing Debian's postgresql package"
    if [ "$(id -u)" -ne 0 ]; then
      log "need root to apt-get install postgresql; install it, or point DATABASE_URL / TEST_DATABASE_URL at a server"
      exit 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
    d=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  fi
  echo "$d"
}

# pg_answers reports whether something accepts connections on 127.0.0.1:$1.
pg_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
