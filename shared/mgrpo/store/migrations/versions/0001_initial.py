"""Initial schema: every table of the stats store (see mgrpo.store.models).

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-21 03:13:41.618512
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

# A 64-bit key on PostgreSQL; on SQLite only INTEGER is a rowid (and it is 64-bit there).
PK = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('agents',
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('tool', sa.String(length=100), nullable=True),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('queue', sa.String(length=200), nullable=False),
    sa.Column('model', sa.String(length=100), nullable=False),
    sa.Column('registered_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('checkpoints',
    sa.Column('id', PK, autoincrement=True, nullable=False),
    sa.Column('model', sa.String(length=100), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('uri', sa.Text(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('round_id', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('model', 'version', name='uq_checkpoints_key')
    )
    op.create_table('group_stats',
    sa.Column('id', PK, autoincrement=True, nullable=False),
    sa.Column('round_id', sa.String(length=200), nullable=False),
    sa.Column('model', sa.String(length=100), nullable=False),
    sa.Column('agent', sa.String(length=100), nullable=False),
    sa.Column('group_key', sa.String(length=400), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('mean', sa.Float(), nullable=False),
    sa.Column('std', sa.Float(), nullable=False),
    sa.Column('published_by', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('round_id', 'model', 'agent', 'group_key', name='uq_group_stats_key')
    )
    with op.batch_alter_table('group_stats', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_group_stats_round_id'), ['round_id'], unique=False)

    op.create_table('metrics',
    sa.Column('id', PK, autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('round_id', sa.String(length=200), nullable=False),
    sa.Column('key', sa.String(length=200), nullable=False),
    sa.Column('value', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'round_id', 'key', name='uq_metrics_key')
    )
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_metrics_run_id'), ['run_id'], unique=False)

    op.create_table('observed_d',
    sa.Column('id', PK, autoincrement=True, nullable=False),
    sa.Column('agent', sa.String(length=100), nullable=False),
    sa.Column('round_id', sa.String(length=200), nullable=False),
    sa.Column('query_id', sa.String(length=200), nullable=False),
    sa.Column('rollout', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('d', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('agent', 'round_id', 'query_id', 'rollout', 'attempt',
                        name='uq_observed_d_key')
    )
    with op.batch_alter_table('observed_d', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_observed_d_agent'), ['agent'], unique=False)

    op.create_table('planner_outcomes',
    sa.Column('id', PK, autoincrement=True, nullable=False),
    sa.Column('round_id', sa.String(length=200), nullable=False),
    sa.Column('query_id', sa.String(length=200), nullable=False),
    sa.Column('rollout', sa.Integer(), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('format_ok', sa.Boolean(), nullable=False),
    sa.Column('correct', sa.Float(), nullable=False),
    sa.Column('reward', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('round_id', 'query_id', 'rollout', 'attempt',
                        name='uq_planner_outcomes_key')
    )
    with op.batch_alter_table('planner_outcomes', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_planner_outcomes_round_id'), ['round_id'],
                              unique=False)

    op.create_table('processed_messages',
    sa.Column('key', sa.String(length=400), nullable=False),
    sa.Column('consumer', sa.String(length=200), nullable=False),
    sa.Column('processed_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('key')
    )
    op.create_table('queries',
    sa.Column('query_id', sa.String(length=200), nullable=False),
    sa.Column('question', sa.Text(), nullable=True),
    sa.Column('answer', sa.Text(), nullable=True),
    sa.Column('meta', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('query_id')
    )
    op.create_table('runs',
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('run_id')
    )
    op.create_table('trajectories',
    sa.Column('id', PK, autoincrement=True, nullable=False),
    sa.Column('traj_id', sa.String(length=400), nullable=False),
    sa.Column('attempt', sa.Integer(), nullable=False),
    sa.Column('round_id', sa.String(length=200), nullable=False),
    sa.Column('query_id', sa.String(length=200), nullable=False),
    sa.Column('rollout', sa.Integer(), nullable=False),
    sa.Column('agent', sa.String(length=100), nullable=False),
    sa.Column('model', sa.String(length=100), nullable=False),
    sa.Column('invocation', sa.Integer(), nullable=False),
    sa.Column('turn', sa.Integer(), nullable=True),
    sa.Column('weights_version', sa.Integer(), nullable=False),
    sa.Column('n_tokens', sa.Integer(), nullable=False),
    sa.Column('n_response_tokens', sa.Integer(), nullable=False),
    sa.Column('format_ok', sa.Boolean(), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=True),
    sa.Column('payload_uri', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('traj_id', 'attempt', name='uq_trajectories_key')
    )
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.create_index('ix_trajectories_round_model', ['round_id', 'model'], unique=False)

    op.create_table('rounds',
    sa.Column('round_id', sa.String(length=200), nullable=False),
    sa.Column('run_id', sa.String(length=200), nullable=False),
    sa.Column('index', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.run_id'], ),
    sa.PrimaryKeyConstraint('round_id'),
    sa.UniqueConstraint('run_id', 'index', name='uq_rounds_run_index')
    )
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rounds_run_id'), ['run_id'], unique=False)

    op.create_table('rollouts',
    sa.Column('id', PK, autoincrement=True, nullable=False),
    sa.Column('round_id', sa.String(length=200), nullable=False),
    sa.Column('query_id', sa.String(length=200), nullable=False),
    sa.Column('rollout', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('completed_attempt', sa.Integer(), nullable=True),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['round_id'], ['rounds.round_id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('round_id', 'query_id', 'rollout', name='uq_rollouts_key')
    )
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rollouts_round_id'), ['round_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('rollouts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rollouts_round_id'))

    op.drop_table('rollouts')
    with op.batch_alter_table('rounds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rounds_run_id'))

    op.drop_table('rounds')
    with op.batch_alter_table('trajectories', schema=None) as batch_op:
        batch_op.drop_index('ix_trajectories_round_model')

    op.drop_table('trajectories')
    op.drop_table('runs')
    op.drop_table('queries')
    op.drop_table('processed_messages')
    with op.batch_alter_table('planner_outcomes', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_planner_outcomes_round_id'))

    op.drop_table('planner_outcomes')
    with op.batch_alter_table('observed_d', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_observed_d_agent'))

    op.drop_table('observed_d')
    with op.batch_alter_table('metrics', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_metrics_run_id'))

    op.drop_table('metrics')
    with op.batch_alter_table('group_stats', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_group_stats_round_id'))

    op.drop_table('group_stats')
    op.drop_table('checkpoints')
    op.drop_table('agents')
