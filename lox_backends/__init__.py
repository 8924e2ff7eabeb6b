"""lox backends: where logs go (the console, Parquet files, trackers), as pluggy plugins.

The folders are the parts (docs/contributing.md has one line per module):

- `plugin/`: the contract a backend implements (`hooks`), config strings (`config`), finding plugins (`registry`);
- `logger/`: the public `Logger`, its runs, checks, per-backend threads, multi-process jobs and exit;
- `runstore/`: runs on disk and in buckets: the format (`layout`), its writer, reader and filesystems;
- `trackers/`: the tracker template, its sending threads, `lox sync`, and one module per tracker;
- `console`, `memory`, `parquet`: the thin backends;
- `tools/`: the `lox` command, plots, the demo and the earlier lox's tracker names.

The core (`lox_core`) does not depend on any of it. Plugins import the contract as
``from lox_backends import hooks``, a name that stays when the layout changes.
"""

import importlib.abc
import sys

from lox_backends.plugin import hooks as hooks

# The plugin contract's public name (plugins.md), as a module too: plugins written for earlier
# releases import it as the module `lox_backends.hooks` (``import lox_backends.hooks as hooks``).
sys.modules.setdefault(f"{__name__}.hooks", hooks)

# Where the modules of lox 0.2's flat layout went. Importing one by its old name fails with the new
# name, rather than with a bare ModuleNotFoundError (plugins and scripts written against 0.2 name them).
MOVED = {
    "config": "lox_backends.plugin.config (Option, mask_secrets, check_options)",
    "registry": "lox_backends.plugin.registry (registry, BackendNotFound)",
    "tracker": "lox_backends.trackers.template (TrackerBackend, Unsendable, ended_status), "
               "lox_backends.trackers.tables (Batch, Scalars, scalars, arrays) and lox_backends.trackers.sync (sync)",
    "store": "lox_backends.runstore.reader (load, runs, run_status); lox.load is the public name of load",
    "storage": "lox_backends.runstore.filesystems",
    "logger": "lox.loggers (Logger, LoggerState, from_config, BackendError), or lox_backends.logger.logger",
    "worker": "lox_backends.logger.worker (BackendError: also lox.loggers.BackendError)",
    "batching": "lox_backends.logger.pending",
    **{name: f"lox_backends.logger.{name}" for name in ("runs", "checks", "processes", "shutdown", "metadata")},
    **{name: f"lox_backends.trackers.{name}" for name in ("mlflow", "wandb", "neptune", "tensorboard")},
    **{name: f"lox_backends.tools.{name}" for name in ("cli", "plot", "demo", "aliases")},
}


def moved_message(old: str) -> str:
    """What an import of lox 0.2's module `lox_backends.<old>` is told."""
    return f"lox_backends.{old} is no longer a module: since lox_backends was split into parts it is {MOVED[old]}."


class _MovedModules(importlib.abc.MetaPathFinder):
    """Asked last, for names no file provides: the modules that moved say where to."""

    def find_spec(self, fullname, path, target=None):  # noqa: ARG002 - the finder protocol
        package, _, old = fullname.partition(".")
        if package == __name__ and old in MOVED and old != "logger":  # `logger` is a package again
            raise ModuleNotFoundError(moved_message(old), name=fullname)
        return None


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


def __getattr__(name: str):
    if name in MOVED and name != "logger":  # `from lox_backends import store`, as 0.2's modules were named
        raise ModuleNotFoundError(moved_message(name), name=f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
