"""alertmanager_destinations.auth_kind and .credential: basic auth or a bearer token for an Alertmanager

`credential` is the Authorization header's value, sealed with FABRICWATCH_SECRETS_KEY like the webhook
secrets (service/notify/sealing.py); `auth_kind` (basic, bearer) is what the API shows instead.

Revision ID: 0220
Revises: 0210
Create Date: 2026-12-01 16:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0220"
down_revision: str | tuple[str, ...] | None = "0210"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("alertmanager_destinations", sa.Column("auth_kind", sa.String(16), nullable=True))
    op.add_column("alertmanager_destinations", sa.Column("credential", sa.Text, nullable=True))
    op.create_check_constraint("am_auth_kind", "alertmanager_destinations", "auth_kind in ('basic', 'bearer')")


def downgrade() -> None:
    op.drop_constraint("am_auth_kind", "alertmanager_destinations")
    op.drop_column("alertmanager_destinations", "credential")
    op.drop_column("alertmanager_destinations", "auth_kind")
