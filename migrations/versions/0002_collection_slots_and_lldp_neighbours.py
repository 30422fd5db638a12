"""collection slots and lldp neighbours

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 14:18:03.304693
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('lldp_neighbors',
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('local_port', sa.String(length=128), nullable=False),
    sa.Column('remote_device', sa.String(length=256), nullable=False),
    sa.Column('remote_port', sa.String(length=256), nullable=False),
    sa.Column('seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('device_id', 'local_port')
    )
    op.create_table('collection_slots',
    sa.Column('endpoint_id', sa.Integer(), nullable=False),
    sa.Column('grp', sa.String(length=16), nullable=False),
    sa.Column('last_slot', sa.BigInteger(), nullable=False),
    sa.ForeignKeyConstraint(['endpoint_id'], ['endpoints.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('endpoint_id', 'grp')
    )


def downgrade() -> None:
    op.drop_table('collection_slots')
    op.drop_table('lldp_neighbors')
