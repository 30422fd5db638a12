"""merge the domain branches: detection, alerts, incidents/drains (+ change triggers), NCCL and rollups
were written in parallel on top of 0003; from here on there is one head again.

Revision ID: 0070
Revises: 0010, 0020, 0040, 0050, 0060
Create Date: 2026-11-30 16:08:55.974832
"""

from collections.abc import Sequence

revision: str = "0070"
down_revision: str | tuple[str, ...] | None = ("0010", "0020", "0040", "0050", "0060")
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    pass
