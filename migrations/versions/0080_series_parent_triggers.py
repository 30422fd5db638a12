"""series: delete with their device or port by triggers on the parents, not per-row foreign keys

A foreign key checks its parent with one query per inserted row: creating the 110k series of a
512-host import spent more time in those checks than in storing the rows. The ingest path now
locks the devices and ports it creates series for (FOR KEY SHARE, one statement per round), which
is what the per-row checks did, and these statement triggers delete a parent's series as the
ON DELETE CASCADE did.

Revision ID: 0080
Revises: 0070
Create Date: 2026-11-30 19:50:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0080"
down_revision: str | tuple[str, ...] | None = "0070"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_PARENTS = (("devices", "device_id"), ("ports", "port_id"))


def upgrade() -> None:
    op.drop_constraint("series_device_id_fkey", "series", type_="foreignkey")
    op.drop_constraint("series_port_id_fkey", "series", type_="foreignkey")
    op.create_index("series_port", "series", ["port_id"])  # a port's series, found when it goes
    for table, column in _PARENTS:
        op.execute(f"""
CREATE FUNCTION series_follow_{table}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  DELETE FROM series WHERE {column} IN (SELECT id FROM gone);
  RETURN NULL;
END $$""")
        op.execute(f"CREATE TRIGGER series_follow_{table} AFTER DELETE ON {table} REFERENCING OLD TABLE AS gone "
                   f"FOR EACH STATEMENT EXECUTE FUNCTION series_follow_{table}()")


def downgrade() -> None:
    for table, _ in _PARENTS:
        op.execute(f"DROP TRIGGER series_follow_{table} ON {table}")
        op.execute(f"DROP FUNCTION series_follow_{table}()")
    op.drop_index("series_port", table_name="series")
    op.execute("DELETE FROM series s WHERE NOT EXISTS (SELECT 1 FROM devices d WHERE d.id = s.device_id) "
               "OR (s.port_id IS NOT NULL AND NOT EXISTS (SELECT 1 FROM ports p WHERE p.id = s.port_id))")
    op.create_foreign_key("series_device_id_fkey", "series", "devices", ["device_id"], ["id"], ondelete="CASCADE")
    op.create_foreign_key("series_port_id_fkey", "series", "ports", ["port_id"], ["id"], ondelete="CASCADE")
