"""change events: triggers that NOTIFY the API's SSE stream of drain, incident and target changes

Triggers, not application code, so every writer (API, Celery workers, a person in psql) is seen,
and PostgreSQL delivers the notification only when the writing transaction commits. The payload
shape is service.events.encode's: {"kind", "data", "at"}.

Revision ID: 0060
Revises: 0030
Create Date: 2026-11-30
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0060"
down_revision: str | None = "0030"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TRIGGERS = {
    # table: (kind, json data built from NEW)
    "drain_recommendations": ("drain", "json_build_object('id', NEW.id, 'status', NEW.status, 'target', NEW.target, "
                                       "'action', NEW.action, 'pod', NEW.pod)"),
    "incidents": ("incident", "json_build_object('id', NEW.id, 'state', NEW.state, 'entity', NEW.entity, "
                              "'cause', NEW.cause)"),
    "target_status": ("target", "json_build_object('endpoint_id', NEW.endpoint_id, 'ok', NEW.consecutive_failures = 0, "
                                "'last_error', left(NEW.last_error, 300))"),
}


def upgrade() -> None:
    for table, (kind, data) in _TRIGGERS.items():
        op.execute(f"""
CREATE FUNCTION fw_notify_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_notify('fabricwatch_events',
    json_build_object('kind', '{kind}', 'data', {data}, 'at', now())::text);
  RETURN NEW;
END $$""")
        op.execute(f"CREATE TRIGGER fw_notify AFTER INSERT OR UPDATE ON {table} "
                   f"FOR EACH ROW EXECUTE FUNCTION fw_notify_{table}()")


def downgrade() -> None:
    for table in _TRIGGERS:
        op.execute(f"DROP TRIGGER IF EXISTS fw_notify ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS fw_notify_{table}()")
