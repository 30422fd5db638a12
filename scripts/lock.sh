#!/usr/bin/env bash
# Refresh requirements.lock: the exact versions every install takes (scripts/run.sh, scripts/test.sh and
# the Dockerfile install with `-c requirements.lock`), resolved from pyproject.toml's dependencies and its
# `dev` extra. Run it after changing either; commit the result with the change.
#   bash scripts/lock.sh                              # keep the current pins, add what is new
#   bash scripts/lock.sh --upgrade                    # newest releases the ranges allow
#   bash scripts/lock.sh --upgrade-package fastapi    # one package (and what it needs)
# Resolved for CPython 3.11 on Linux (the Docker image's), with pip-tools in a throwaway virtualenv.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ "$("$PY" -c 'import sys; print(*sys.version_info[:2], sep=".")')" != "3.11" ]; then
  echo "lock.sh: $PY is not Python 3.11; set PYTHON to a 3.11 interpreter (the lock is for the image's)" >&2
  exit 2
fi
tools=$(mktemp -d)
trap 'rm -rf "$tools"' EXIT
"$PY" -m venv "$tools"
"$tools/bin/python" -m pip install -q "pip-tools==7.6.2"
CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh" "$tools/bin/pip-compile" -q --extra dev --strip-extras \
  --no-emit-index-url --no-emit-find-links --output-file requirements.lock "$@" pyproject.toml
