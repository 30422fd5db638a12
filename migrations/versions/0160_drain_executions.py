"""drain_executions: the outbox through which an approved drain is executed, at most once

An approval used to run the executor (a subprocess or a webhook, up to 120 s) inside its request's
transaction, holding the drain safety lock; a crash mid-drain left the drain `pending`, and a second
approval ran it again. Now the approval commits an execution row (`queued`, idempotency key
`drain-<id>-<seq>`), a worker claims it (`running`, started_at, worker) and records its end
(`succeeded` / `failed`, finished_at, result); an execution that started and never recorded an end is
`unknown` and is never run again on its own. `drain_recommendations.status` widens to 32 characters
and its check constraint takes `execution_failed` and `execution_unknown`.

Revision ID: 0160
Revises: 0150
Create Date: 2026-12-04 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0160"
down_revision: str | tuple[str, ...] | None = "0150"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_LIVE = "state IN ('queued', 'running')"
_STATUSES = "'blocked', 'pending', 'approved', 'rejected', 'done', 'released', 'withdrawn'"


def upgrade() -> None:
    op.alter_column("drain_recommendations", "status", type_=sa.String(32), existing_type=sa.String(16))
    op.drop_constraint("drain_status", "drain_recommendations", type_="check")
    op.create_check_constraint("drain_status", "drain_recommendations",
                               f"status IN ({_STATUSES}, 'execution_failed', 'execution_unknown')")
    op.create_table(
        "drain_executions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("drain_id", sa.Integer(), sa.ForeignKey("drain_recommendations.id", ondelete="CASCADE"),
                  nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(64), nullable=False, unique=True),
        sa.Column("executor", sa.String(16), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("request", JSONB(), nullable=False),
        sa.Column("requested_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True)),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("worker", sa.String(256)),
        sa.Column("steps", JSONB(), nullable=False, server_default="[]"),
        sa.Column("result", JSONB()),
        sa.CheckConstraint("state in ('queued', 'running', 'succeeded', 'failed', 'unknown', 'cancelled')",
                           name="drain_execution_state"),
    )
    op.create_index("drain_executions_live", "drain_executions", ["drain_id"], unique=True,
                    postgresql_where=sa.text(_LIVE))
    op.create_index("drain_executions_drain", "drain_executions", ["drain_id", "seq"], unique=True)
    op.create_index("drain_executions_due", "drain_executions", ["id"], postgresql_where=sa.text(_LIVE))


def downgrade() -> None:
    op.drop_table("drain_executions")
    # the new statuses go back to the nearest old one: approved (capacity may still be held)
    op.drop_constraint("drain_status", "drain_recommendations", type_="check")
    op.execute("UPDATE drain_recommendations SET status = 'approved' "
               "WHERE status IN ('execution_failed', 'execution_unknown')")
    op.alter_column("drain_recommendations", "status", type_=sa.String(16), existing_type=sa.String(32))
    op.create_check_constraint("drain_status", "drain_recommendations", f"status IN ({_STATUSES})")
