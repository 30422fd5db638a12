"""missing_pods: the pods whose telemetry the dashboards cannot see now, always empty on one server

The telemetry dashboards show a panel that reads `missing_pods`. On a sharded deployment Grafana's role
finds `fleet_grafana.missing_pods` first on its search_path (service/shards/grafana.py: the pods of the
shards that do not answer); on one server, and for any other reader, this view answers: nothing is missing.
Its columns are those of the sharded view.

Revision ID: 0300
Revises: 0290
Create Date: 2026-12-03 16:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0300"
down_revision: str | tuple[str, ...] | None = "0290"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE = "fabricwatch_grafana"


def upgrade() -> None:
    op.execute("CREATE VIEW missing_pods AS SELECT NULL::text AS pod, NULL::text AS shard, NULL::text AS reason "
               "WHERE false")
    # the role may be absent (migration 0150 leaves it to an operator when the migrating user cannot create it)
    op.execute(f"""
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
    GRANT SELECT ON missing_pods TO {ROLE};
  END IF;
END $$""")


def downgrade() -> None:
    op.execute("DROP VIEW missing_pods")
