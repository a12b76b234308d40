#!/bin/sh
# First start: a cluster owned by POSTGRES_USER (password login over TCP) and the database
# POSTGRES_DB (default: the user's name), set up by a server on a private socket, so that
# the healthcheck (pg_isready on the default socket) only passes once the real server runs.
# Then exec postgres, so it gets the stop signal directly.
set -eu
user=${POSTGRES_USER:-postgres}
db=${POSTGRES_DB:-$user}
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}" > "$pwfile"
  initdb -U "$user" --pwfile="$pwfile" --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  setup=$(mktemp -d)
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses='' -k $setup" start >/dev/null
  [ "$db" = postgres ] || createdb -h "$setup" -U "$user" "$db"
  pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
  rm -rf "$setup"
fi
exec postgres -D "$PGDATA"
