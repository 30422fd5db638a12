"""Where tests find the repository and the vendored real device captures (provenance in SOURCES.md)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
FIXTURES = DATA / "real"
