"""``leases.problem``: what keeps a lease's holder from doing its work (a trainer whose
checkpoint disk is full), so that other processes (the planner API) can say so and refuse
work that would fail. Null when the holder reports none; a new holder starts with none.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('leases', sa.Column('problem', sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('leases') as batch:
        batch.drop_column('problem')
