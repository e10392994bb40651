# Start a throw-away PostgreSQL cluster on 127.0.0.1 for the test suite and export
# SESSIONRAY_TEST_PG_URL. Durability is off (fsync, synchronous_commit): the cluster is
# throw-away and tests commit thousands of small transactions.
# Sourced by .ci/run; usable by hand: `source .ci/postgres.sh; start_test_postgres`.
start_test_postgres() {
  local bindir
  bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$bindir" ]; then echo "no PostgreSQL server binaries found" >&2; return 1; fi
  local dir=${SESSIONRAY_PG_DIR:-/tmp/sessionray-pg}
  local port=${SESSIONRAY_PG_PORT:-55432}
  if ! id postgres >/dev/null 2>&1; then useradd -r -m postgres; fi
  if [ ! -f "$dir/PG_VERSION" ]; then
    rm -rf "$dir"; mkdir -p "$dir"; chown postgres "$dir"
    su postgres -c "$bindir/initdb -D $dir -U postgres -A trust >/dev/null"
  fi
  if ! su postgres -c "$bindir/pg_ctl -D $dir status" >/dev/null 2>&1; then
    su postgres -c "$bindir/pg_ctl -D $dir -l $dir/server.log -o '-p $port -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off' -w start" >/dev/null
  fi
  export SESSIONRAY_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
  echo "PostgreSQL at $SESSIONRAY_TEST_PG_URL"
}
