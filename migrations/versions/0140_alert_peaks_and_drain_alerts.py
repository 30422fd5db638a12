"""alerts keep the peak of their firing episode; drain recommendations name the alert behind them

An alert's summary and evidence used to be rewritten by every detection cycle, so an alert that was
clearing read "0 flaps in one poll step" and so did its drain's reason. `peak_score`,
`peak_evidence` and `peak_at_ms` keep the worst cycle of the episode (the summary is that cycle's).
`drain_recommendations.alert_id` ties a drain to its alert, so the drain can be withdrawn when the
alert resolves and the API can show the alert's state next to the drain.

Revision ID: 0140
Revises: 0130
Create Date: 2026-12-03 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0140"
down_revision: str | tuple[str, ...] | None = "0130"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("alerts", sa.Column("peak_score", sa.Float(), nullable=False, server_default="0"))
    op.add_column("alerts", sa.Column("peak_evidence", JSONB(), nullable=False, server_default="[]"))
    op.add_column("alerts", sa.Column("peak_at_ms", sa.BigInteger(), nullable=True))
    # Existing alerts: what they hold now is the best that is known of their episode.
    op.execute("UPDATE alerts SET peak_score = score, peak_evidence = evidence, peak_at_ms = last_seen_ms")
    # A plain id, as incidents.alert_id: a caller may name an alert this database does not hold (the join
    # then shows no alert state), and an alert removed later leaves the drain's history intact.
    op.add_column("drain_recommendations", sa.Column("alert_id", sa.BigInteger(), nullable=True))
    op.execute("UPDATE drain_recommendations d SET alert_id = i.alert_id FROM incidents i WHERE d.incident_id = i.id")
    op.create_index("drain_recommendations_alert", "drain_recommendations", ["alert_id"])


def downgrade() -> None:
    op.drop_index("drain_recommendations_alert", table_name="drain_recommendations")
    op.drop_column("drain_recommendations", "alert_id")
    op.drop_column("alerts", "peak_at_ms")
    op.drop_column("alerts", "peak_evidence")
    op.drop_column("alerts", "peak_score")
