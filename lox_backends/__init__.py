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

import sys

from lox_backends.plugin import hooks as hooks

# The plugin contract's public name (plugins.md), as a module too: plugins written for earlier
# releases import it as the module `lox_backends.hooks` (``import lox_backends.hooks as hooks``).
sys.modules.setdefault(f"{__name__}.hooks", hooks)
