"""series: the identity key leads with device and metric, and replaces the (device_id, metric) index

An import of a new fabric creates every series at once (110k for 512 hosts), and most of that time
went to index inserts: the identity key led with the metric text, so new series, which come device
by device, landed in one of ~30 places of it. Led by (device_id, metric), the same key fills almost
in order (one device's few pages at a time) and serves every lookup `series_device_metric` served
(by device, or device and metric, as ingest's join of staged series does); that index goes. A lookup
by metric alone now reads the table (~40 MB at 400k series): those readers (fleet views, dashboards)
take a large share of the series anyway.

Revision ID: 0110
Revises: 0100
Create Date: 2026-12-01 02:10:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0110"
down_revision: str | tuple[str, ...] | None = "0100"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _identity(columns: str) -> None:
    op.execute("ALTER TABLE series DROP CONSTRAINT series_identity")
    op.execute(f"ALTER TABLE series ADD CONSTRAINT series_identity UNIQUE NULLS NOT DISTINCT ({columns})")


def upgrade() -> None:
    _identity("device_id, metric, port_id, lane, priority, gpu")
    op.execute("DROP INDEX series_device_metric")


def downgrade() -> None:
    op.execute("CREATE INDEX series_device_metric ON series (device_id, metric)")
    _identity("metric, device_id, port_id, lane, priority, gpu")
