"""shard_pods: the state of a pod's move between shards (issue 20 item 6; docs/architecture.md#shards)

- `move_to`: while set, the pod's history is being copied to that shard and every write for the pod goes to
  it first and then to `shard` (service/shards/rebalance.py);
- `move_cursor`: the highest series id of the old shard copied so far (a re-run goes on from there);
- `leftover`: a shard that still holds a copy of the pod to delete (the old one after a switch, the target
  after an abort); `apply` keeps the pod's inventory on it until then;
- `moved_from`, `moved_at`: the last finished move, so a setting that still names the old shard is
  tolerated (with a warning) instead of refused.

Revision ID: 0280
Revises: 0270
Create Date: 2026-12-03 08:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0280"
down_revision: str | tuple[str, ...] | None = "0270"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("shard_pods", sa.Column("move_to", sa.String(40)))
    op.add_column("shard_pods", sa.Column("move_cursor", sa.Integer))
    op.add_column("shard_pods", sa.Column("leftover", sa.String(40)))
    op.add_column("shard_pods", sa.Column("moved_from", sa.String(40)))
    op.add_column("shard_pods", sa.Column("moved_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    for name in ("moved_at", "moved_from", "leftover", "move_cursor", "move_to"):
        op.drop_column("shard_pods", name)
