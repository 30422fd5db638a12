"""gnmi_stream_state: per gNMI target, the state of its Subscribe stream and what path discovery learned

One row per gNMI endpoint. `state` is streaming, reconnecting, stalled or fallback-polling, with the
reason and since when; `owner` and `lease_until` name the worker that holds the stream (a worker renews
its lease every few seconds; another may take a target over once the lease has run out). While a
target is not `streaming` under a live lease, the dispatcher polls it with Get. `discovery` keeps the
request path that answered each wanted path, the target's capabilities and the encoding chosen, for
polls and streams alike.

Revision ID: 0170
Revises: 0160
Create Date: 2026-12-05 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0170"
down_revision: str | tuple[str, ...] | None = "0160"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "gnmi_stream_state",
        sa.Column("endpoint_id", sa.Integer, sa.ForeignKey("endpoints.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("state", sa.String(32), nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("since", sa.DateTime(timezone=True), nullable=True),
        sa.Column("owner", sa.String(200), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_data_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("discovery", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("state IS NULL OR state IN ('streaming', 'reconnecting', 'stalled', 'fallback-polling')",
                           name="gnmi_stream_state_state"),
    )


def downgrade() -> None:
    op.drop_table("gnmi_stream_state")
