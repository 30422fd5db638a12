"""webhook_outbox: a claimed row carries a lease instead of a row lock held while it is sent

Delivery used to keep a row locked (FOR UPDATE) for the whole HTTP POST, one row at a time, so a
receiver that never answered cost every other receiver its time-out. Now a worker claims rows in a
short transaction and marks them in flight with `leased_until`; the POSTs run concurrently outside
any transaction. A row whose worker died mid-send is due again once its lease has run out. The
partial index holds only rows in flight, so counting them per subscription (the per-receiver cap)
stays cheap however long a dead receiver's backlog grows.

Revision ID: 0130
Revises: 0120
Create Date: 2026-12-02 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0130"
down_revision: str | tuple[str, ...] | None = "0120"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("webhook_outbox", sa.Column("leased_until", sa.DateTime(timezone=True), nullable=True))
    op.create_index("webhook_outbox_leased", "webhook_outbox", ["subscription_id"],
                    postgresql_where=sa.text("leased_until IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("webhook_outbox_leased", table_name="webhook_outbox")
    op.drop_column("webhook_outbox", "leased_until")
