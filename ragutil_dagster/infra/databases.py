"""Where ragutil's two stores live, chosen by environment variables, and one check that a
database is reachable before Dagster or MLflow start retrying against it.

- The Dagster instance (runs, event log, schedules, pool slots): SQLite under
  ``$RAGUTIL_HOME/dagster`` by default; PostgreSQL when ``$RAGUTIL_DAGSTER_POSTGRES_URL`` is set
  (``runner.dagster_instance`` writes it into ``dagster.yaml`` as dagster-postgres's
  ``postgres_url``); any hand-written ``dagster.yaml`` when ``$DAGSTER_HOME`` is set.
- MLflow tracking: ``$MLFLOW_TRACKING_URI`` (``postgresql://…``, ``sqlite:///…`` or an
  ``http(s)://`` server), else ``sqlite:///$RAGUTIL_HOME/mlflow.db``.
- The generation cache (models/cache.py): ``$RAGUTIL_GENERATION_CACHE_URL`` (``postgresql://…``
  or ``sqlite:///…``), else ``$RAGUTIL_HOME/cache/generations/generations.sqlite``.
"""

from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING

from ragutil_dagster.errors import DatabaseUnavailableError
from ragutil_dagster.infra.files import embedded_tracking_uri, ragutil_home
from ragutil_dagster.infra.redaction import redact_uri

DAGSTER_POSTGRES_URL_VARIABLE = "RAGUTIL_DAGSTER_POSTGRES_URL"
DAGSTER_HOME_VARIABLE = "DAGSTER_HOME"
MLFLOW_TRACKING_URI_VARIABLE = "MLFLOW_TRACKING_URI"
GENERATION_CACHE_URL_VARIABLE = "RAGUTIL_GENERATION_CACHE_URL"

if TYPE_CHECKING:
    import sqlalchemy

# MLflow and Dagster accept SQLAlchemy URLs of these dialects as stores (``postgresql+psycopg2://``
# included); ragutil reaches them directly for its claims (tracking/claims.py).
_DATABASE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
CONNECT_TIMEOUT_SECONDS = 10


def default_tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` when set, else the embedded store of ``$RAGUTIL_HOME``."""
    return os.environ.get(MLFLOW_TRACKING_URI_VARIABLE) or embedded_tracking_uri(ragutil_home())


def is_database_uri(uri: str) -> bool:
    """Whether ``uri`` names a database (as opposed to an ``http(s)://`` server or a directory)."""
    return uri.split(":", 1)[0].split("+", 1)[0] in _DATABASE_SCHEMES


@functools.cache
def database_engine(url: str, tables: sqlalchemy.MetaData) -> sqlalchemy.Engine:
    """One engine per database and process, with ragutil's ``tables`` created on first use."""
    import sqlalchemy

    # SQLite: wait for a writer (MLflow, another process) instead of failing "database is locked".
    options = {"timeout": 60} if url.startswith("sqlite") else {}
    engine = sqlalchemy.create_engine(url, connect_args=options)
    try:
        tables.create_all(engine)
    except sqlalchemy.exc.DBAPIError:
        # Processes starting together race to create the tables; losing that race is fine.
        inspector = sqlalchemy.inspect(engine)
        if not all(inspector.has_table(name) for name in tables.tables):
            raise
    return engine


def dagster_postgres_url(url: str) -> str:
    """``url`` with the psycopg2 driver named, as dagster-postgres needs it: SQLAlchemy 2.1 opens a
    bare ``postgresql://`` URL with psycopg 3, under which dagster-postgres's ``NOTIFY``
    statements are syntax errors."""
    scheme, _, rest = url.partition("://")
    return f"postgresql+psycopg2://{rest}" if scheme in ("postgresql", "postgres") else url


def check_reachable(url: str, what: str, variable: str) -> None:
    """Connect to the database server at ``url`` once, or raise :class:`DatabaseUnavailableError`
    naming ``what`` and the ``variable`` that chose it (nothing to check for a SQLite file or an
    ``http(s)://`` server). Dagster and MLflow retry a refused connection (MLflow with backoff
    for close to an hour) instead of saying so."""
    import sqlalchemy
    from sqlalchemy.pool import NullPool

    if url.startswith("sqlite") or not is_database_uri(url):
        return
    options = {"connect_timeout": CONNECT_TIMEOUT_SECONDS} if url.startswith("postgresql") else {}
    engine = sqlalchemy.create_engine(url, poolclass=NullPool, connect_args=options)
    try:
        with engine.connect():
            pass
    except sqlalchemy.exc.DBAPIError as err:
        reason = (
            str(err.orig).strip().splitlines()[0] if err.orig is not None else type(err).__name__
        )
        raise DatabaseUnavailableError(
            f"cannot reach {what} at {redact_uri(url)} ({reason}); start the database or change "
            f"or unset {variable}"
        ) from None
    finally:
        engine.dispose()
