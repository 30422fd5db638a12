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
# With arguments: pytest as asked. Without: the suite in parallel workers (pytest-xdist; its tests wait on
# servers, workers and peers more than on the CPU), then the tests marked `serial` alone: they assert
# wall-clock bounds, which a loaded machine would break. FABRICWATCH_TEST_WORKERS sets the workers (4);
# the 30 slowest are listed, to see where the time goes.
if (($#)); then exec .venv/bin/python -m pytest "$@"; fi
rc=0
.venv/bin/python -m pytest -n "${FABRICWATCH_TEST_WORKERS:-4}" -m "not serial" --durations=30 || rc=$?
.venv/bin/python -m pytest -m serial || rc=$?
exit "$rc"
