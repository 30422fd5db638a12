#!/usr/bin/env bash
# Install fabricwatch into .venv and run it. With no FABRICWATCH_DATABASE_URL set it starts an
# embedded PostgreSQL (and uses it as the Celery broker), so nothing else needs installing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq python3-venv >/dev/null
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# the locked versions (requirements.lock; bash scripts/lock.sh refreshes it), fabricwatch itself editable
.venv/bin/python -m pip install -q -c requirements.lock -e .
exec .venv/bin/fabricwatch "${@:-serve}"
