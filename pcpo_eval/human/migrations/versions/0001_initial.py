"""The initial schema: raters, pairs, responses (one response per rater and pair).

Revision ID: 0001
Revises:
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "raters",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("token", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_raters")),
        sa.UniqueConstraint("name", name=op.f("uq_raters_name")),
        sa.UniqueConstraint("token", name=op.f("uq_raters_token")),
    )
    op.create_table(
        "pairs",
        sa.Column("pair_id", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.Text(), nullable=False),
        sa.Column("left_image", sa.String(length=64), nullable=False),
        sa.Column("right_image", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("pair_id", name=op.f("pk_pairs")),
    )
    op.create_table(
        "responses",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("rater_id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.String(length=64), nullable=False),
        sa.Column("choice", sa.String(length=8), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("choice IN ('left', 'right', 'tie')", name=op.f("ck_responses_choice")),
        sa.ForeignKeyConstraint(["pair_id"], ["pairs.pair_id"], name=op.f("fk_responses_pair_id_pairs")),
        sa.ForeignKeyConstraint(["rater_id"], ["raters.id"], name=op.f("fk_responses_rater_id_raters")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_responses")),
        sa.UniqueConstraint("rater_id", "pair_id", name=op.f("uq_responses_rater_id_pair_id")),
    )


def downgrade() -> None:
    op.drop_table("responses")
    op.drop_table("pairs")
    op.drop_table("raters")
