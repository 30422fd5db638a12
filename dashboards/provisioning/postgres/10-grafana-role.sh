#!/bin/sh
# Run once by the postgres image when docker-compose first creates its volume
# (mounted at /docker-entrypoint-initdb.d): the login role Grafana connects as. Its read-only
# grants come from the fabricwatch migrations (0150); see docs/dashboards.md.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  -v pw="$FABRICWATCH_GRAFANA_DB_PASSWORD" <<'SQL'
CREATE ROLE fabricwatch_grafana LOGIN PASSWORD :'pw';
SQL
