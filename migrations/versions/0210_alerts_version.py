"""alerts_version: a counter every transaction that writes alerts moves; the alert list's ETag validator

One row (epoch, n). A deferred constraint trigger on alerts bumps n once per writing transaction,
at its commit: a detection cycle, an ack, a resolve, a hand-written UPDATE, all alike. The bump is
part of the writer's transaction, so a reader that sees version n sees every alert write that made
it, and nothing newer is hidden behind it. Deferred to commit, the row lock is held for the commit
only: an ack does not queue behind a whole detection cycle for it. A TRUNCATE (tests, a reset)
bumps it too; when the row itself is gone the next write recreates it with a new random epoch, so
ETags handed out before never match again. service/alerts/listcache.py reads it.

Revision ID: 0210
Revises: 0200
Create Date: 2026-12-01 16:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import UUID

revision: str = "0210"
down_revision: str | tuple[str, ...] | None = "0200"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A transaction-local marker (set_config(..., true)) holding the writer's transaction id: the first
# alert row of a transaction bumps, the rest of its rows skip. Compared with the id, not just set, so a
# value left in the session by an aborted transaction can never suppress the next one's bump.
_BUMP = """
CREATE FUNCTION alerts_version_bump() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('fabricwatch.alerts_version_bumped', true) IS DISTINCT FROM txid_current()::text THEN
        INSERT INTO alerts_version (id, n) VALUES (1, 1)
        ON CONFLICT (id) DO UPDATE SET n = alerts_version.n + 1;
        PERFORM set_config('fabricwatch.alerts_version_bumped', txid_current()::text, true);
    END IF;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "alerts_version",
        sa.Column("id", sa.SmallInteger, primary_key=True),
        sa.Column("epoch", UUID(as_uuid=True), nullable=False, server_default=sa.text("gen_random_uuid()")),
        sa.Column("n", sa.BigInteger, nullable=False, server_default="0"),
        sa.CheckConstraint("id = 1", name="alerts_version_one_row"),
    )
    op.execute("INSERT INTO alerts_version (id, n) VALUES (1, 0)")
    op.execute(_BUMP)
    op.execute("CREATE CONSTRAINT TRIGGER alerts_version_bump AFTER INSERT OR UPDATE OR DELETE ON alerts "
               "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION alerts_version_bump()")
    op.execute("CREATE TRIGGER alerts_version_truncate AFTER TRUNCATE ON alerts "
               "FOR EACH STATEMENT EXECUTE FUNCTION alerts_version_bump()")


def downgrade() -> None:
    op.execute("DROP TRIGGER alerts_version_truncate ON alerts")
    op.execute("DROP TRIGGER alerts_version_bump ON alerts")
    op.execute("DROP FUNCTION alerts_version_bump()")
    op.drop_table("alerts_version")
