#!/usr/bin/env bash
# ensure-promtool.sh: print the path of promtool (Prometheus's rule checker),
# installing Debian's prometheus package, which ships it, when it is missing.
# The alert rules' tests (internal/metrics, TestAlertRules) run it.
set -euo pipefail

log() { echo "ensure-promtool: $*" >&2; }

if [ -n "${PROMTOOL:-}" ] && [ -x "$PROMTOOL" ]; then
  echo "$PROMTOOL"
  exit 0
fi
if p=$(command -v promtool); then
  echo "$p"
  exit 0
fi
log "promtool is missing; installing Debian's prometheus package (it ships promtool)"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  log "need root and apt-get to install it; install promtool (Debian/Ubuntu: apt-get install prometheus; or a Prometheus release tarball) and put it on PATH, or set PROMTOOL"
  exit 1
fi
# Debian ships promtool only in the server's package. On a host with
# systemd the package also starts a Prometheus server on :9090, which the
# tests do not need (systemctl disable --now prometheus stops it); in a
# container without an init it starts nothing.
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >&2 ||
  { DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >&2; }
command -v promtool
