"""detector_state.blob: stored as written, not compressed again by PostgreSQL

The detector state is a deflated npz (service/detection/state.py, FeatureState.to_bytes). With the column's
default storage (EXTENDED) PostgreSQL tried pglz on every cycle's blob before storing it out of line, and
gave up, the bytes being compressed already: a 72-port fabric's 1.4 MB state took 35 ms to write, 10 ms
stored as it is (EXTERNAL: out of line, uncompressed). Rows written before keep their storage until the next save rewrites them.

Revision ID: 0310
Revises: 0300
Create Date: 2026-12-06 02:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0310"
down_revision: str | tuple[str, ...] | None = "0300"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE detector_state ALTER COLUMN blob SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.execute("ALTER TABLE detector_state ALTER COLUMN blob SET STORAGE EXTENDED")
