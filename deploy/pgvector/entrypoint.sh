#!/bin/bash
# First start: initdb with POSTGRES_USER as superuser and the password from
# POSTGRES_PASSWORD_FILE, then CREATE DATABASE POSTGRES_DB. Every start: the server as uid 999,
# listening on all addresses with scram-sha-256 passwords (the trust for local socket
# connections is what pg_isready and the setup use).
set -euo pipefail
: "${POSTGRES_USER:?}" "${POSTGRES_DB:?}" "${POSTGRES_PASSWORD_FILE:?}"
as_postgres=(setpriv --reuid=postgres --regid=postgres --init-groups)
chown postgres:postgres "$PGDATA" && chmod 0700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    head -n1 "$POSTGRES_PASSWORD_FILE" >"$pwfile"
    chown postgres "$pwfile"
    "${as_postgres[@]}" initdb -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
    "${as_postgres[@]}" pg_ctl -D "$PGDATA" -w -o "-c listen_addresses=''" start >/dev/null
    "${as_postgres[@]}" psql -v ON_ERROR_STOP=1 -q -U "$POSTGRES_USER" -d postgres \
        -c "CREATE DATABASE \"$POSTGRES_DB\""
    "${as_postgres[@]}" pg_ctl -D "$PGDATA" -m fast -w stop >/dev/null
fi
exec "${as_postgres[@]}" postgres -D "$PGDATA" -c listen_addresses='*'
