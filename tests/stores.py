"""New MLflow stores without MLflow's migrations every time (tests/conftest.py takes the fixtures).

MLflow makes a new SQLite store by creating its first tables and running its Alembic migrations one by one:
about 1 CPU s on a quiet core and several under the suite's load, in each of the many tests that point
MLflow at a store of their own. Each worker migrates one empty store once, and every new SQLite store its
process opens gets that store's schema and Alembic revision, copied with SQLite's backup API; a test whose
`fedauc` command (a process of its own) makes the store copies it there first (``new_mlflow_store``). What
MLflow does next (the default experiment, the schema check at the head revision) is its own, as with a store
it migrated itself."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _migrated_store(tmp_path_factory):
    """The worker's migrated empty store, made by the first test that needs it (MLflow's own migrations), and
    MLflow's migration as it was (for stores that are not SQLite files)."""
    import mlflow.store.db.utils as db_utils
    from sqlalchemy import create_engine

    migrate = db_utils._initialize_tables
    template = tmp_path_factory.getbasetemp() / "mlflow-schema.db"

    def path() -> Path:
        if not template.exists():
            engine = create_engine(f"sqlite:///{template}")
            migrate(engine)
            engine.dispose()
        return template

    return path, migrate


@pytest.fixture(scope="session", autouse=True)
def migrated_mlflow_schema(_migrated_store):
    import mlflow.store.db.utils as db_utils
    from mlflow.store.model_registry import sqlalchemy_store as registry_store

    template, migrate = _migrated_store

    def copy_schema(engine) -> None:
        if engine.url.get_backend_name() != "sqlite":
            migrate(engine)
            return
        source = sqlite3.connect(template())
        try:
            with engine.connect() as connection:
                source.backup(connection.connection.driver_connection)
        finally:
            source.close()

    # The tracking store calls it through its module, the registry store through its own import of it.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(db_utils, "_initialize_tables", copy_schema)
        patch.setattr(registry_store, "_initialize_tables", copy_schema)
        yield


@pytest.fixture
def new_mlflow_store(_migrated_store):
    """``new_mlflow_store(path)``: an empty migrated store at ``path`` (a new file), its tracking URI."""
    template, _ = _migrated_store

    def copy(path: Path) -> str:
        shutil.copyfile(template(), path)
        return f"sqlite:///{path}"

    return copy
