#!/usr/bin/env bash
# Install the test tools and run the whole suite: ruff, pip-audit, then pytest (which also runs
# `alembic check`, models against migrations, in tests/test_migrations.py).
# Uses FABRICWATCH_TEST_DATABASE_URL / FABRICWATCH_TEST_REDIS_URL when set (CI points them at real
# servers); without them the tests start the embedded PostgreSQL and use it as the broker too.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v snmpd >/dev/null || need_apt+=(snmpd)
command -v snmpbulkwalk >/dev/null || need_apt+=(snmp)
command -v chromium >/dev/null || need_apt+=(chromium)
# remote write, scraping and Alertmanager are tested against the real programs (package = command name)
for pkg in prometheus prometheus-node-exporter prometheus-snmp-exporter prometheus-alertmanager; do
  command -v "$pkg" >/dev/null || need_apt+=("$pkg")
done
python3 -c 'import ensurepip, venv' 2>/dev/null || need_apt+=(python3-venv)
if ((${#need_apt[@]})); then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# the locked versions (requirements.lock; bash scripts/lock.sh refreshes it), fabricwatch itself editable
.venv/bin/python -m pip install -q -c requirements.lock -e ".[dev]"

.venv/bin/ruff check .
bash scripts/audit.sh
exec .venv/bin/python -m pytest "$@"
