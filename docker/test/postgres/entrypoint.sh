#!/bin/sh
# First start: a cluster owned by POSTGRES_USER (password login over TCP), then POSTGRES_DB.
# Then exec postgres, so it gets the stop signal directly.
set -eu
if [ ! -s "$PGDATA/PG_VERSION" ]; then
  pwfile=$(mktemp)
  printf '%s\n' "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is not set}" > "$pwfile"
  initdb -U "${POSTGRES_USER:-postgres}" --pwfile="$pwfile" --auth-local=trust \
    --auth-host=scram-sha-256 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
  echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
  pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
  if [ "${POSTGRES_DB:-}" ] && [ "$POSTGRES_DB" != "${POSTGRES_USER:-postgres}" ]; then
    createdb -U "${POSTGRES_USER:-postgres}" "$POSTGRES_DB"
  fi
  pg_ctl -D "$PGDATA" -w -m fast stop >/dev/null
fi
exec postgres -D "$PGDATA"
