"""fabricwatch_grafana: the read-only role Grafana connects as

SELECT on exactly the tables the dashboards read (and the sample tables under the `samples` view and
the samples_between / last_samples functions, which run with the caller's rights); nothing on tokens,
webhooks or endpoints, and no right to write anything. No default privileges: they would grant
SELECT on every future table, secrets included, and the daily and rollup partitions need none, since
PostgreSQL checks a partitioned table's privileges, not its partitions', when it is queried. A new
table a dashboard reads is granted by the migration that makes it (tests/api/test_dashboards_sql.py
runs every panel as this role, so a missing grant fails there).

The role is created NOLOGIN when absent (roles are per cluster: it may exist already, created with
a password by docker-compose's PostgreSQL init script or by an operator, see docs/dashboards.md).
A migrating user without CREATEROLE gets a notice and no role; the grants then wait for a rerun. Two
databases of one cluster migrated at once may both find the role absent: the second CREATE ROLE then
waits for the first and finds it made (roles are per cluster; the migration lock is per database).

Revision ID: 0150
Revises: 0140
Create Date: 2026-12-03 12:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0150"
down_revision: str | tuple[str, ...] | None = "0140"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE = "fabricwatch_grafana"
TABLES = ("devices", "ports", "links", "optics", "series", "samples", "sample_rows", "sample_blocks",
          "rollup_5m", "rollup_1h", "target_status", "alerts", "alert_events", "drain_recommendations",
          "drain_breaker", "incidents", "incident_events", "nccl_runs", "nccl_results", "nccl_baselines")


def upgrade() -> None:
    grants = "".join(f"EXECUTE 'GRANT SELECT ON {t} TO {ROLE}';\n" for t in TABLES)
    op.execute(f"""
DO $$
BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
    IF NOT (SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user) THEN
      RAISE NOTICE 'role {ROLE} not created: % may not create roles (docs/dashboards.md)', current_user;
      RETURN;
    END IF;
    BEGIN
      CREATE ROLE {ROLE} NOLOGIN;
    EXCEPTION WHEN duplicate_object OR unique_violation THEN
      NULL;  -- created meanwhile by a migration of another database of this cluster
    END;
  END IF;
  EXECUTE format('GRANT CONNECT ON DATABASE %I TO {ROLE}', current_database());
  GRANT USAGE ON SCHEMA public TO {ROLE};
  {grants}
END $$""")


def downgrade() -> None:
    # The role stays: other databases of the cluster may grant it rights too.
    revokes = "".join(f"EXECUTE 'REVOKE ALL ON {t} FROM {ROLE}';\n" for t in TABLES)
    op.execute(f"""
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
    {revokes}
    REVOKE USAGE ON SCHEMA public FROM {ROLE};
    EXECUTE format('REVOKE CONNECT ON DATABASE %I FROM {ROLE}', current_database());
  END IF;
END $$""")
