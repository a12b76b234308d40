"""Checkpoints belong to a run: ``checkpoints.run_id`` and the key (run_id, model, version).

Versions are per run, so a second run's round never rewrites the first run's version.
Existing rows get the run of their round (``rounds.run_id``), or ``''`` when they have none.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.add_column(sa.Column('run_id', sa.String(length=200), nullable=False,
                                      server_default=''))
    op.execute("UPDATE checkpoints SET run_id = COALESCE((SELECT rounds.run_id FROM rounds "
               "WHERE rounds.round_id = checkpoints.round_id), '')")
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_constraint('uq_checkpoints_key', type_='unique')
        batch_op.create_unique_constraint('uq_checkpoints_key', ['run_id', 'model', 'version'])


def downgrade() -> None:
    # Versions of different runs may collide once run_id is gone: keep the oldest of each.
    op.execute("DELETE FROM checkpoints WHERE id NOT IN (SELECT MIN(id) FROM checkpoints "
               "GROUP BY model, version)")
    with op.batch_alter_table('checkpoints', schema=None) as batch_op:
        batch_op.drop_constraint('uq_checkpoints_key', type_='unique')
        batch_op.create_unique_constraint('uq_checkpoints_key', ['model', 'version'])
        batch_op.drop_column('run_id')
