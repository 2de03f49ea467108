"""Seconds from serving a pair's page to its answer, with each response and re-answer.

* ``responses.seconds`` and ``corrections.seconds``: the time between the app serving the page (the
  time sealed into the page's answer key) and the answer arriving; NULL for answers stored before
  this migration, an undo row, or an answer stored without the app (``db.submit`` without it).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for table in ("responses", "corrections"):
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    for table in ("corrections", "responses"):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("seconds")
