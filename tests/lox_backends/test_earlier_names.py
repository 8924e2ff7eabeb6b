"""Scripts and plugins written against lox 0.2's flat layout of lox_backends: the contract
keeps its name (`lox_backends.hooks`), and every other module that moved, imported by its
old name, fails saying where it is now (lox_backends/__init__.py, and the old attributes of
lox_backends.logger and lox_backends.parquet)."""

import subprocess
import sys

import pytest

from lox_backends import MOVED


def outcome(statement: str) -> str:
    """What a fresh interpreter says to `statement`: "ok", or the exception's type and message."""
    code = f"try:\n    {statement}\n    print('ok')\nexcept Exception as e:\n    print(type(e).__name__, e)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("statement", ["from lox_backends import hooks", "import lox_backends.hooks as hooks",
                                       "from lox_backends.hooks import Backend, BackendSpec, RunInfo, hookimpl"])
def test_the_plugin_contract_keeps_its_name(statement):
    assert outcome(statement) == "ok"


@pytest.mark.parametrize("statement, said", [
    # modules that moved
    ("import lox_backends.tracker", "ModuleNotFoundError lox_backends.tracker is no longer a module: since "
                                    "lox_backends was split into parts it is lox_backends.trackers.template "
                                    "(TrackerBackend"),
    ("from lox_backends.tracker import TrackerBackend", "lox_backends.trackers.tables (Batch"),
    ("from lox_backends.config import Option", "ModuleNotFoundError lox_backends.config is no longer a module: "
                                               "since lox_backends was split into parts it is "
                                               "lox_backends.plugin.config (Option"),
    ("from lox_backends import store", "lox_backends.runstore.reader (load, runs"),
    ("import lox_backends.mlflow", "lox_backends.trackers.mlflow"),
    ("from lox_backends.registry import registry", "lox_backends.plugin.registry (registry"),
    # the old attributes of packages that stayed
    ("from lox_backends.logger import Logger", "ImportError lox_backends.logger is a package since lox_backends "
                                               "was split into parts: Logger is in lox.loggers"),
    ("from lox_backends.logger import BackendError", "BackendError is in lox.loggers"),
    ("from lox_backends.parquet import runs", "ImportError lox_backends.parquet.runs is now "
                                              "lox_backends.runstore.reader.runs"),
    ("from lox_backends.parquet import load", "lox.load is its public name"),
])
def test_a_name_that_moved_says_where_it_is_now(statement, said):
    assert said in outcome(statement)


def test_every_moved_name_is_named_where_it_now_is_and_that_place_exists():
    import importlib

    for where in MOVED.values():
        module = where.split(" ")[0].rstrip(",")
        importlib.import_module(module)  # the new name imports
    assert outcome("import lox_backends.nothing") == "ModuleNotFoundError No module named 'lox_backends.nothing'"
    assert outcome("from lox_backends.logger import metadata, worker") == "ok"  # submodules as usual
