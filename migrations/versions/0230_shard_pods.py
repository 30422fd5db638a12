"""shard_pods: which telemetry shard holds each pod (issue 20; docs/architecture.md#shards)

Kept in the control database and written from the topology setting (service/shards/setup.py); an
unsharded deployment has it empty. Pod '' stands for devices without a pod.

Revision ID: 0230
Revises: 0220
Create Date: 2026-12-01 19:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0230"
down_revision: str | tuple[str, ...] | None = "0220"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "shard_pods",
        sa.Column("pod", sa.String(128), primary_key=True),
        sa.Column("shard", sa.String(40), nullable=False),
        sa.Column("assigned_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
    )
    op.create_index("ix_shard_pods_shard", "shard_pods", ["shard"])


def downgrade() -> None:
    op.drop_index("ix_shard_pods_shard", "shard_pods")
    op.drop_table("shard_pods")
