"""Loggers: send logs to backends (console, Parquet files, trackers, plugins).

    logger = lox.loggers.from_config("console,parquet:runs")
    state = logger.init(jax.random.key(0), lr=1e-3)
    out = logger.spool(train, state)(params)
    logger.finish(state)

Besides `ConsoleLogger`, `SaveLogger` and `MultiLogger`, every registered
backend has a Logger named after it: ``lox.loggers.ParquetLogger("runs")``,
``lox.loggers.MemoryLogger()``, and ``lox.loggers.JsonlLogger("logs")`` once a
plugin offering ``jsonl`` is installed.
"""

from typing import Any, Callable

from lox_backends.logger.logger import DEFAULT_CONFIG as DEFAULT_CONFIG
from lox_backends.logger.logger import BackendError as BackendError
from lox_backends.logger.logger import ConsoleLogger as ConsoleLogger
from lox_backends.logger.logger import Logger as Logger
from lox_backends.logger.logger import LoggerState as LoggerState
from lox_backends.logger.logger import MultiLogger as MultiLogger
from lox_backends.logger.logger import SaveLogger as SaveLogger
from lox_backends.logger.logger import backend_logger as backend_logger
from lox_backends.logger.logger import from_config as from_config
from lox_backends.plugin.registry import registry


def __getattr__(attribute: str) -> Callable[..., Logger]:
    # `FooBarLogger` → a Logger for the backend named "foo-bar" or "foo_bar" or "foobar".
    if attribute.endswith("Logger") and attribute[:1].isupper():
        wanted = attribute[: -len("Logger")].lower()
        for name in registry.offers():
            if name.replace("-", "").replace("_", "").lower() == wanted:

                def make(target: str | None = None, *, name_: str = name, **options: Any) -> Logger:
                    return backend_logger(name_, target, **options)

                make.__name__ = make.__qualname__ = attribute
                make.__doc__ = f"A Logger for the {name!r} backend: {attribute}(target=None, **options)."
                return make
    raise AttributeError(f"module 'lox.loggers' has no attribute {attribute!r}")
