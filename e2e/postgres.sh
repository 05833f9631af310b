#!/usr/bin/env bash
# A throwaway PostgreSQL server for the ledger tests, from Debian's packages.
#
#   e2e/postgres.sh start   # initdb (first time) + start; prints the URL on stdout
#   e2e/postgres.sh url     # print the URL
#   e2e/postgres.sh stop    # stop the server (the data folder stays)
#   e2e/postgres.sh wipe    # stop and delete the data folder
#
# Environment:
#   KACCEL_E2E_CACHE   cache folder (default ~/.cache/kaccel-e2e); the server lives
#                      in $KACCEL_E2E_CACHE/postgres-run
#   KACCEL_PG_PORT     TCP port on 127.0.0.1 (default 25432)
# Installs the `postgresql` package with apt-get when no server binaries are found.
# PostgreSQL refuses to run as root: as root the server runs as the system user
# kaccel-pg (created when missing). Trust authentication, 127.0.0.1 only.
set -euo pipefail

CACHE="${KACCEL_E2E_CACHE:-$HOME/.cache/kaccel-e2e}"
RUN="$CACHE/postgres-run"
PORT="${KACCEL_PG_PORT:-25432}"
PG_USER_OS=kaccel-pg
DB_USER=kaccel
DB_NAME=kaccel
log() { printf 'postgres.sh: %s\n' "$*" >&2; }

find_bin() {
  local d
  d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
  if [[ -z "$d" || ! -x "$d/initdb" ]]; then
    log "no PostgreSQL server binaries under /usr/lib/postgresql; installing the postgresql package"
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo=sudo
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql >&2
    d="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    [[ -n "$d" && -x "$d/initdb" ]] || { log "installing postgresql gave no initdb"; exit 1; }
  fi
  BIN="$d"
}

# as_pg CMD...: run CMD as the server's OS user.
as_pg() {
  if [[ $(id -u) -eq 0 ]]; then
    runuser -u "$PG_USER_OS" -- "$@"
  else
    "$@"
  fi
}

prepare_user() {
  [[ $(id -u) -eq 0 ]] || return 0
  if ! id "$PG_USER_OS" >/dev/null 2>&1; then
    log "creating system user $PG_USER_OS"
    useradd --system --no-create-home --shell /usr/sbin/nologin "$PG_USER_OS"
  fi
  mkdir -p "$RUN"
  chown -R "$PG_USER_OS:" "$RUN"
  # The server must reach its folder: root's home is usually private.
  if ! runuser -u "$PG_USER_OS" -- test -x "$RUN"; then
    local alt="/var/tmp/kaccel-e2e-postgres-run"
    log "$PG_USER_OS cannot reach $RUN (private parent folder); using $alt"
    RUN="$alt"
    mkdir -p "$RUN"
    chown -R "$PG_USER_OS:" "$RUN"
  fi
}

url() { echo "postgres://$DB_USER@127.0.0.1:$PORT/$DB_NAME"; }

running() { [[ -f "$RUN/data/postmaster.pid" ]] && as_pg "$BIN/pg_ctl" -D "$RUN/data" status >/dev/null 2>&1; }

start() {
  find_bin
  mkdir -p "$RUN"
  prepare_user
  if [[ ! -f "$RUN/data/PG_VERSION" ]]; then
    log "initdb into $RUN/data ($BIN)"
    as_pg "$BIN/initdb" -D "$RUN/data" -U "$DB_USER" -A trust -E UTF8 --no-locale >"$RUN/initdb.log" 2>&1 \
      || { cat "$RUN/initdb.log" >&2; exit 1; }
  fi
  if running; then
    log "already running on 127.0.0.1:$PORT"
  else
    as_pg "$BIN/pg_ctl" -D "$RUN/data" -l "$RUN/server.log" -w -t 60 \
      -o "-p $PORT -k $RUN -c listen_addresses=127.0.0.1 -c max_connections=200" start >&2 \
      || { tail -n 30 "$RUN/server.log" >&2; exit 1; }
  fi
  if ! "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -d postgres -tAc \
      "SELECT 1 FROM pg_database WHERE datname = '$DB_NAME'" | grep -q 1; then
    "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U "$DB_USER" -d postgres -qc "CREATE DATABASE $DB_NAME" >&2
  fi
  url
}

stop() {
  find_bin
  prepare_user
  if running; then
    as_pg "$BIN/pg_ctl" -D "$RUN/data" -m fast -w stop >&2
  else
    log "not running"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  url) url ;;
  wipe) stop; rm -rf "$RUN" /var/tmp/kaccel-e2e-postgres-run ;;
  *) echo "usage: $0 start|stop|url|wipe" >&2; exit 2 ;;
esac
