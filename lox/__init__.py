"""lox: accelerated logging for JAX.

`lox.log` records values anywhere in JAX code; `lox.spool` returns them as
outputs of one compiled program, `lox.tap` streams them to a callback, and
`lox.nolog` removes them. `lox.image`, `lox.video`, `lox.audio` and
`lox.histogram` mark what a value is, for backends to show it as such.
`lox.loggers` sends them to backends (the console, Parquet files, plugins),
`lox.load` reads saved runs back and `lox.runs` tabulates them (one row per
run: metadata and summaries, to compare runs).

``import lox`` loads the core only: `lox.loggers`, `lox.load`, `lox.runs`, `lox.wandb` and
`lox.neptune` (with pyarrow and the backends) load the first time they are used.
"""

import importlib
from typing import TYPE_CHECKING, Any

from lox_core.logdict import NO_STEP as NO_STEP
from lox_core.logdict import Event as Event
from lox_core.logdict import logdict as logdict
from lox_core.media import audio as audio
from lox_core.media import histogram as histogram
from lox_core.media import image as image
from lox_core.media import video as video
from lox_core.nolog import nolog as nolog
from lox_core.primitive import log as log
from lox_core.printing import set_default as set_default
from lox_core.spool import spool as spool
from lox_core.tap import tap as tap

if TYPE_CHECKING:  # loaded on first use (`__getattr__`), to keep `import lox` light
    from lox import loggers as loggers
    from lox import neptune as neptune
    from lox import wandb as wandb
    from lox_backends.runstore.reader import load as load
    from lox_backends.runstore.table import run_table as runs

__version__ = "0.2.0"

_LAZY = {"loggers": ("lox.loggers", None), "wandb": ("lox.wandb", None), "neptune": ("lox.neptune", None),
         "load": ("lox_backends.runstore.reader", "load"), "runs": ("lox_backends.runstore.table", "run_table")}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'lox' has no attribute {name!r}")
    module, attribute = _LAZY[name]
    value = importlib.import_module(module)
    if attribute is not None:
        value = getattr(value, attribute)
    globals()[name] = value  # once loaded, an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted((set(globals()) - {"importlib", "TYPE_CHECKING", "Any"}) | set(_LAZY))  # lox's names, not its imports


__all__ = ["log", "spool", "tap", "nolog", "logdict", "Event", "set_default", "NO_STEP", "image", "video", "audio",
           "histogram", "loggers", "load", "runs",
           "wandb", "neptune"]
