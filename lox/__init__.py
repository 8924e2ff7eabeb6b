"""lox: accelerated logging for JAX.

`lox.log` records values anywhere in JAX code; `lox.spool` returns them as
outputs of one compiled program, `lox.tap` streams them to a callback, and
`lox.nolog` removes them. `lox.loggers` sends them to backends (the console,
Parquet files, plugins) and `lox.load` reads saved runs back.
"""

from lox import loggers as loggers
from lox import neptune as neptune
from lox import wandb as wandb
from lox_backends.runstore.reader import load as load
from lox_core.logdict import NO_STEP as NO_STEP
from lox_core.logdict import Event as Event
from lox_core.logdict import logdict as logdict
from lox_core.nolog import nolog as nolog
from lox_core.primitive import log as log
from lox_core.printing import set_default as set_default
from lox_core.spool import spool as spool
from lox_core.tap import tap as tap

__version__ = "0.2.0"


__all__ = ["log", "spool", "tap", "nolog", "logdict", "Event", "set_default", "NO_STEP", "loggers", "load", "wandb",
           "neptune"]
