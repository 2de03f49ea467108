"""Alembic environment of the rating database, run programmatically by :func:`pcpo_eval.human.db.upgrade`.

The caller passes an open connection in ``config.attributes["connection"]``; without one (plain
``alembic`` on the command line) an engine is made from ``sqlalchemy.url``. SQLite runs in batch
mode so later migrations can alter tables.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from pcpo_eval.human.db import Base, get_engine

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    """Emit the SQL without a database (``alembic upgrade --sql``)."""
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    """Migrate over the caller's connection, or a new one from ``sqlalchemy.url``."""
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    with get_engine(config.get_main_option("sqlalchemy.url")).connect() as conn:
        _run(conn)
        conn.commit()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
