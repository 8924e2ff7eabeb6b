"""Multi-process jobs (`jax.distributed`): one run per logical run, written once.

Every process of a job runs the same program and creates the same Loggers in
the same order. `Job` is that job as a Logger sees it:

* **Run ids every process agrees on.** Process 0 names the group of each of
  its Loggers and publishes it through JAX's distributed runtime (its
  key-value store); the other processes wait for it. Runs are numbered in
  the order `logger.init` opens them, so ``jax.vmap(logger.init)(keys)``
  called on every process gives every process the same run ids.
* **Who writes.** By default (``processes="first"``) process 0 writes to the
  backends. Values passed to a logger outside `jax.jit` are held by every
  process: process 0 writes them, the others drop them. A jitted program's
  host calls run on its first device, so on process 0; a program on
  process-local arrays runs on every process alike, whose host calls the
  others drop in the same way. The one exception,
  logger calls inside `shard_map` or `pmap`, whose host calls run on every
  device of every process, is refused at the call (on every process alike).
  With ``processes="each"`` every process writes runs of its own (their ids
  end in ``-p<index>`` and their metadata holds ``process_index``): for
  debugging, and for logger calls inside `shard_map` / `pmap`.
* **Values sharded across processes** are gathered at the call, on every
  process at once (`host_local`), so the writer gets the whole value.

>>> job = Job("first")  # outside a multi-process job: one process, which writes
>>> (job.index, job.count, job.writes, job.group(lambda: "g", timeout=1.0))
(0, 1, True, 'g')
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

import jax
from jax.experimental import multihost_utils

from lox_core import _compat

PROCESSES = ("first", "each")

# The Loggers a process created while in a multi-process job, in order: the
# name under which process 0 publishes each one's group.
_loggers = itertools.count()


class Job:
    """The processes of the job this process belongs to (see the module docstring)."""

    def __init__(self, processes: str):
        if processes not in PROCESSES:
            raise ValueError(
                f"a Logger's `processes` is 'first' (process 0 writes, the default) or 'each' (every process "
                f"writes runs of its own), got {processes!r}."
            )
        self.processes = processes
        self.index, self.count, self._client = _compat.distributed_runtime()

    @property
    def writes(self) -> bool:
        """Whether this process writes to the backends."""
        return self.processes == "each" or self.index == 0

    @property
    def per_device_error(self) -> str | None:
        """Why logger calls inside `shard_map` / `pmap` are refused (None where they are not)."""
        if self.count == 1 or self.processes == "each":
            return None
        return (
            f"a lox logger is called inside shard_map or pmap in a job of {self.count} processes: its host "
            "calls would run on every device of every process, and only process 0 writes. Create the logger "
            "with `processes='each'` (each process writes runs of its own), or call it outside shard_map / "
            "pmap (e.g. return the values and log them outside)."
        )

    def group(self, make: Callable[[], str], timeout: float) -> str:
        """The group of a new Logger's runs, the same on every process: made
        by process 0 (`make`), published, and awaited by the others."""
        if self.count == 1:
            return make()
        number = next(_loggers)
        key = f"lox/logger-{number}/group"
        if self.index == 0:
            group = make()
            self._client.key_value_set(key, group)
        else:
            try:
                group = self._client.blocking_key_value_get(key, int(timeout * 1000))
            except Exception as error:  # the runtime's timeout error has no public type
                raise TimeoutError(
                    f"lox: process {self.index} waited {timeout:g} s for process 0 to create its Logger number "
                    f"{number} ({error}). Create the same Loggers on every process, in the same order."
                ) from error
        return group if self.processes == "first" else f"{group}-p{self.index}"

    def check_unchanged(self) -> None:
        """A Logger made before `jax.distributed.initialize` would write one run per process."""
        if _compat.distributed_runtime()[1] != self.count:
            raise RuntimeError(
                "this lox Logger was created before `jax.distributed.initialize()`, so each process would "
                "write runs of its own under different ids; create loggers after initializing the job."
            )


def host_local(logs: Any) -> Any:
    """`logs` with each array this process cannot read whole made readable:
    a replicated one as its local copy, one sharded across processes gathered
    from every process (a collective: every process calls this at once, as
    every process calls the logger)."""

    def local(x):
        if not isinstance(x, jax.Array) or x.is_fully_addressable:
            return x
        if x.is_fully_replicated:
            return x.addressable_data(0)
        return multihost_utils.process_allgather(x, tiled=True)

    return jax.tree_util.tree_map(local, logs)
