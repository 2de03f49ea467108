"""Revocable rater links and answer corrections (undo), keeping every first answer.

* ``raters.revoked_at``: set by ``human raters --revoke``; a revoked rater's link is refused.
* ``corrections``: one row per undo (``choice`` NULL) or re-answer after an undo (``choice`` set) of
  one (rater, pair); ``seq`` counts them from 1 and ``UNIQUE(rater_id, pair_id, seq)`` keeps two
  simultaneous clicks from both being stored. ``responses`` is never updated: the first answer stays.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-25
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("raters") as batch:
        batch.add_column(sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "corrections",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("rater_id", sa.Integer(), nullable=False),
        sa.Column("pair_id", sa.String(length=64), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("choice", sa.String(length=8), nullable=True),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("choice IS NULL OR choice IN ('left', 'right', 'tie')",
                           name=op.f("ck_corrections_choice")),
        sa.ForeignKeyConstraint(["pair_id"], ["pairs.pair_id"], name=op.f("fk_corrections_pair_id_pairs")),
        sa.ForeignKeyConstraint(["rater_id"], ["raters.id"], name=op.f("fk_corrections_rater_id_raters")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_corrections")),
        sa.UniqueConstraint("rater_id", "pair_id", "seq", name=op.f("uq_corrections_rater_id_pair_id_seq")),
    )


def downgrade() -> None:
    op.drop_table("corrections")
    with op.batch_alter_table("raters") as batch:
        batch.drop_column("revoked_at")
