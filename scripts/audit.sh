#!/usr/bin/env bash
# Known-vulnerable dependencies in the project's virtualenv (pip-audit against PyPI's advisory data).
# Fails (exit 1) on any known vulnerability. Where the advisory data cannot be reached at all (every
# dependency comes back "not found", as on machines that reach only a package mirror) it says so loudly
# and exits 0: no verdict is not a pass, and the output says which one it was.
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
report=$(mktemp)
trap 'rm -f "$report"' EXIT
"$PY" -m pip_audit --progress-spinner off --skip-editable -f json -o "$report" "$@" 2>/dev/null
"$PY" - "$report" <<'PYEOF'
import json, sys
deps = json.load(open(sys.argv[1])).get("dependencies", [])
vulns = [(d["name"], d["version"], v["id"]) for d in deps for v in d.get("vulns", [])]
skipped = [d["name"] for d in deps if d.get("skip_reason")]
audited = len(deps) - len(skipped)
for name, version, vid in vulns:
    print(f"pip-audit: {name} {version}: {vid}")
if vulns:
    print(f"pip-audit: FAILED: {len(vulns)} known vulnerabilities in {audited} audited dependencies")
    sys.exit(1)
if deps and audited == 0:
    print(f"pip-audit: NO VERDICT: advisory data unreachable; none of {len(deps)} dependencies could be audited")
    sys.exit(0)
print(f"pip-audit: ok: {audited} dependencies audited, no known vulnerabilities"
      + (f" ({len(skipped)} could not be audited: {', '.join(skipped[:10])})" if skipped else ""))
PYEOF
