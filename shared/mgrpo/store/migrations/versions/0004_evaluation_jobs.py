"""Evaluation jobs: ``evaluation_jobs(evaluation_id, status, owner, request, n_questions,
played, result, error, created_at, updated_at, finished_at)``, so that the planner API's
background evaluations survive a restart and every replica answers for them.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('evaluation_jobs',
    sa.Column('evaluation_id', sa.String(length=32), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('owner', sa.String(length=200), nullable=False),
    sa.Column('request', sa.JSON(), nullable=False),
    sa.Column('n_questions', sa.Integer(), nullable=False),
    sa.Column('played', sa.Integer(), nullable=False),
    sa.Column('result', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('evaluation_id'))
    op.create_index('ix_evaluation_jobs_status', 'evaluation_jobs', ['status'])


def downgrade() -> None:
    op.drop_index('ix_evaluation_jobs_status', table_name='evaluation_jobs')
    op.drop_table('evaluation_jobs')
