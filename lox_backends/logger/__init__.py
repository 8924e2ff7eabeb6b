"""The Logger: the public class (`logger`), the runs it opens (`runs`, `metadata`),
what it refuses at the call (`checks`), logs waiting for the next tick
(`pending`), one thread per backend (`worker`), multi-process jobs (`processes`)
and interpreter exit (`shutdown`)."""


# What lox 0.2's module lox_backends.logger held (submodules are found as usual).
_MOVED = {"Logger", "LoggerState", "from_config", "BackendError", "DEFAULT_CONFIG", "ConsoleLogger", "SaveLogger",
          "MultiLogger", "backend_logger"}


def __getattr__(name: str):
    if name in _MOVED:  # say where it is now
        raise ImportError(f"lox_backends.logger is a package since lox_backends was split into parts: {name} is in "
                          f"lox.loggers (the public name) and lox_backends.logger.logger.", name=f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
