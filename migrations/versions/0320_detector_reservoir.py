"""detector_reservoir: the forest's training reservoir stored apart from the state, appended to

The training reservoir (service/detection/state.py) was a member of the state's blob, rewritten every cycle
though a cycle adds a row or two: with 16 cohorts 8 MB a minute, and on a server with autovacuum off 28 GB of
dead TOAST in a 4-day run. A save now appends the cycle's new rows as one chunk and rewrites the reservoir only
when it was trimmed (once a day, at retraining) or the stored one is not the state's (service/detection/
store.py, save_state). A state saved before keeps its reservoir in its blob: the next save writes it out here.

Revision ID: 0320
Revises: 0310
Create Date: 2026-12-06 05:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0320"
down_revision: str | tuple[str, ...] | None = "0310"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("detector_state", sa.Column("reservoir_gen", sa.String(36), nullable=True))
    op.add_column("detector_state", sa.Column("reservoir_rows", sa.Integer(), server_default="0", nullable=False))
    op.create_table(
        "detector_reservoir",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("gen", sa.String(36), nullable=False),
        sa.Column("first_row", sa.Integer(), nullable=False),
        sa.Column("n_rows", sa.Integer(), nullable=False),
        sa.Column("n_cols", sa.Integer(), nullable=False),
        sa.Column("x", sa.LargeBinary(), nullable=False),
        sa.Column("c", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("name", "gen", "first_row"),
    )
    # measured floats: pglz would only try and give up (as for detector_state.blob, 0310)
    op.execute("ALTER TABLE detector_reservoir ALTER COLUMN x SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("detector_reservoir")
    op.drop_column("detector_state", "reservoir_rows")
    op.drop_column("detector_state", "reservoir_gen")
