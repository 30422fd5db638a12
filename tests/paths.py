"""Where tests find the repository and the shared fixtures (CI lays shared/ beside the clone)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures" / "real"
