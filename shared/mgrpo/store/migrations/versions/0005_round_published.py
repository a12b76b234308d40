"""Round outbox: ``rounds.published``, false from a distributed round's creation until every
one of its tasks is on the broker, so a sweep can finish the publishing of a round whose
creator died in between. Rounds that exist already count as published.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('rounds', sa.Column('published', sa.Boolean(), nullable=False,
                                      server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table('rounds') as batch:
        batch.drop_column('published')
