#!/usr/bin/env bash
# What the test suite needs beyond .venv, provisioned by `make test` (and so by .ci/run):
#
#   Debian package  checked at                          used by
#   postgresql      /usr/lib/postgresql/*/bin/postgres  the throw-away test cluster below
#   prometheus      /usr/bin/promtool, /usr/bin/prometheus  tests/deploy
#   chromium        /usr/bin/chromium                   console browser tests (Playwright, no download)
#
# Missing packages are installed when running as root with apt-get (a policy-rc.d denies every
# service start meanwhile); otherwise the script stops with one message naming what to install.
# Then, unless SESSIONRAY_TEST_PG_URL is set, it starts (or reuses) a throw-away PostgreSQL
# cluster on 127.0.0.1 and prints its URL as the only line on stdout; progress goes to stderr.
# The cluster is left running; the next run reuses it, or re-creates it if it cannot start.
#
#   url=$(scripts/test-deps.sh) && export SESSIONRAY_TEST_PG_URL=$url
#   scripts/test-deps.sh --postgres-only   # PostgreSQL alone (what `make bench` needs)
#   scripts/test-deps.sh --stop            # stop the throw-away cluster (`make test-deps-stop`)
#
# apt-get's output goes to a log file ($TMPDIR or /tmp: sessionray-test-deps-apt.log), named in
# the one progress line; its last lines are shown only when it fails.
#
# Settings (environment): SESSIONRAY_PG_DIR (data directory; default /tmp/sessionray-pg, or
# /tmp/sessionray-pg-$USER when not root), SESSIONRAY_PG_PORT (default 55432).
# SESSIONRAY_DEPS_ROOT is for testing this script only: a directory put in front of every path
# checked above (e.g. /nonexistent makes every package look missing).
set -euo pipefail

R=${SESSIONRAY_DEPS_ROOT:-}
only_pg=0
stop=0
case "${1:-}" in
  "") ;;
  --postgres-only) only_pg=1 ;;
  --stop) stop=1 ;;
  *) echo "usage: $0 [--postgres-only | --stop]" >&2; exit 2 ;;
esac
log() { echo "test-deps: $*" >&2; }
die() { echo "test-deps: $*" >&2; exit 1; }

pg_bindir() { # newest PostgreSQL server binaries, empty if none
  local d
  d=$(ls -d "$R"/usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -n "$d" ] && [ -x "$d/postgres" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; fi
}

missing_packages() { # Debian packages whose files are missing, one line each
  if [ -z "${SESSIONRAY_TEST_PG_URL:-}" ] && [ -z "$(pg_bindir)" ]; then echo postgresql; fi
  [ "$only_pg" = 0 ] || return 0
  if [ ! -x "$R/usr/bin/promtool" ] || [ ! -x "$R/usr/bin/prometheus" ]; then echo prometheus; fi
  if [ ! -x "$R/usr/bin/chromium" ]; then echo chromium; fi
}

install_packages() {
  local need
  mapfile -t need < <(missing_packages)
  [ ${#need[@]} -gt 0 ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    die "missing system packages for the tests: run as root \`apt-get install -y ${need[*]}\` (Debian), then \`make test\` again"
  fi
  local apt_log="${TMPDIR:-/tmp}/sessionray-test-deps-apt.log"
  log "installing ${need[*]} (apt-get; its output: $apt_log)"
  export DEBIAN_FRONTEND=noninteractive
  # Packages with daemons (postgresql, prometheus) must not start system services here: a
  # policy-rc.d that denies every start, created only if absent and removed afterwards.
  local own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  local rc=0
  { apt-get update -qq && apt-get install -y -qq "${need[@]}"; } >"$apt_log" 2>&1 || rc=$?
  [ "$own_policy" = 0 ] || rm -f /usr/sbin/policy-rc.d
  [ "$rc" = 0 ] || die "apt-get install ${need[*]} failed (rc=$rc); the end of $apt_log:
$(tail -n 20 "$apt_log")"
  mapfile -t need < <(missing_packages)
  [ ${#need[@]} -eq 0 ] || die "still missing after apt-get install: ${need[*]}"
}

as_pg() { # run a PostgreSQL tool as the cluster's owner (initdb refuses root)
  if [ "$(id -u)" = 0 ]; then (cd /tmp && runuser -u postgres -- "$@"); else (cd /tmp && "$@"); fi
}

pg_dir() { # the throw-away cluster's data directory
  if [ "$(id -u)" = 0 ]; then echo "${SESSIONRAY_PG_DIR:-/tmp/sessionray-pg}"; else echo "${SESSIONRAY_PG_DIR:-/tmp/sessionray-pg-$(id -un)}"; fi
}

stop_postgres() { # stop the throw-away cluster if it runs; its data directory is kept
  local bindir dir
  bindir=$(pg_bindir)
  dir=$(pg_dir)
  if [ -z "$bindir" ] || ! as_pg "$bindir/pg_ctl" -D "$dir" status >/dev/null 2>&1; then
    log "no throw-away PostgreSQL runs in $dir"
    return 0
  fi
  as_pg "$bindir/pg_ctl" -D "$dir" -m fast -w -t 30 stop >/dev/null || die "pg_ctl stop failed for $dir"
  log "stopped the throw-away PostgreSQL in $dir"
}

start_postgres() {
  local bindir dir port lock running_port
  bindir=$(pg_bindir)
  [ -n "$bindir" ] || die "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
  dir=$(pg_dir)
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  fi
  port=${SESSIONRAY_PG_PORT:-55432}
  # One provisioning at a time (two `make test` may start together); the lock goes with the process.
  lock="$dir.lock"
  exec 9>>"$lock"
  flock 9

  init() {
    log "creating a throw-away PostgreSQL cluster in $dir"
    rm -rf "$dir"
    mkdir -p "$dir"
    [ "$(id -u)" != 0 ] || chown postgres: "$dir"
    chmod 700 "$dir"
    as_pg "$bindir/initdb" -D "$dir" -U postgres -A trust >/dev/null
  }
  start() {
    # Durability is off (fsync, synchronous_commit): the cluster is throw-away and the tests
    # commit thousands of small transactions.
    # 9>&-: the server must not inherit (and so hold forever) the lock of this script.
    as_pg "$bindir/pg_ctl" -D "$dir" -l "$dir/server.log" -w -t 60 start -o \
      "-p $port -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
      >/dev/null 9>&-
  }
  running() { as_pg "$bindir/pg_ctl" -D "$dir" status >/dev/null 2>&1; }
  listen_port() { sed -n 4p "$dir/postmaster.pid" 2>/dev/null; } # the port of the running server
  answering() {
    local p
    p=$(listen_port)
    [ -n "$p" ] && "$bindir/pg_isready" -q -h 127.0.0.1 -p "$p" -t "${1:-3}"
  }

  local want_version
  want_version=$(basename "$(dirname "$bindir")")
  if [ ! -f "$dir/PG_VERSION" ] || [ "$(cat "$dir/PG_VERSION")" != "$want_version" ]; then init; fi
  if ! answering; then
    if running; then
      log "the cluster in $dir does not answer; restarting it"
      as_pg "$bindir/pg_ctl" -D "$dir" -m immediate -t 10 stop >/dev/null 2>&1 || true
    fi
    if ! start 2>/dev/null && ! answering 10; then
      log "the existing cluster did not start ($(tail -n 1 "$dir/server.log" 2>/dev/null)); re-creating it"
      init
      start || die "PostgreSQL did not start (port $port taken? set SESSIONRAY_PG_PORT); $dir/server.log ends with:
$(tail -n 20 "$dir/server.log" 2>/dev/null)"
    fi
  fi
  # A reused cluster may have been started on another port: use the one it listens on.
  answering 30 || die "PostgreSQL in $dir does not answer on 127.0.0.1:$(listen_port)"
  running_port=$(listen_port)
  echo "postgresql+psycopg://postgres@127.0.0.1:$running_port/postgres"
}

if [ "$stop" = 1 ]; then
  stop_postgres
  exit 0
fi
install_packages
if [ -n "${SESSIONRAY_TEST_PG_URL:-}" ]; then
  log "PostgreSQL from SESSIONRAY_TEST_PG_URL"
  echo "$SESSIONRAY_TEST_PG_URL"
else
  url=$(start_postgres)
  log "PostgreSQL at $url"
  echo "$url"
fi
