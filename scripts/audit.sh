#!/usr/bin/env bash
# Fail on known-vulnerable dependencies installed in the project's virtualenv (pip-audit, PyPI advisory DB).
# Needs the PyPI JSON API (advisories); exits 1 on a known vulnerability and, with --strict, when a
# dependency could not be audited at all (so an unreachable or partial index never passes silently).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
"$PY" -m pip_audit --progress-spinner off --skip-editable --strict --desc on "$@"
