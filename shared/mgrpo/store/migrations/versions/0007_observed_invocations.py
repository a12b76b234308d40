"""``observed_d.invocations``: WHICH calls of a rollout's attempt a sub-agent answered (their
invocation numbers), beside how many (``d``), so a trainer trains exactly the (role,
invocation) pairs the planner recorded and nothing else that reached its queue. Null where a
writer recorded the count only (embedded runs, rows written before this revision).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('observed_d', sa.Column('invocations', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('observed_d') as batch:
        batch.drop_column('invocations')
