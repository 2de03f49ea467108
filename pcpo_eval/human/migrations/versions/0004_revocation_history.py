"""The history of revocations, so that a rotate no longer erases that a rater's link was revoked.

* ``revocations``: one row per ``human raters --revoke`` of a rater whose link was not revoked
  (``revoked_at``), closed by the ``--rotate`` that reinstates them (``reinstated_at``, NULL while
  revoked). ``raters.revoked_at`` stays the current state (NULL: the link works). Rows are
  back-filled from ``raters.revoked_at`` for raters revoked now; a revocation erased by a rotate
  before this migration is not known.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "revocations",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("rater_id", sa.Integer(), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("reinstated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["rater_id"], ["raters.id"], name=op.f("fk_revocations_rater_id_raters")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_revocations")),
    )
    op.execute("INSERT INTO revocations (rater_id, revoked_at) SELECT id, revoked_at FROM raters "
               "WHERE revoked_at IS NOT NULL")


def downgrade() -> None:
    op.drop_table("revocations")
