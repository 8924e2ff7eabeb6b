"""Helpers shared by the tests: small logdicts, one comparison of logs, a
training loop with two step names, free ports, a process killed mid-run, the
kernels of a compiled program, and a table of schema version 1."""

import os
import re
import signal
import socket
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa

import lox
from lox_core.logdict import concat


def event(step, **values):
    """A one-event logdict of `values` at `step`."""
    return lox.logdict(
        {k: np.asarray([v]) for k, v in values.items()},
        steps={"step": {k: np.array([step]) for k in values}},
    )


def tapped(received):
    """What a tap's callback received (`lox.Event`s, one at a time, or blocks
    of events), concatenated as one logdict, in the order received."""
    return concat([r.to_logdict() if isinstance(r, lox.Event) else r for r in received])


def assert_logs_equal(got, want, *, rtol: float = 0.0, ordered: bool = True, dtypes: bool = True):
    """The same logs: the same keys (in the same order unless `ordered` is
    false), pytree structures, dtypes (unless `dtypes` is false) and values
    (exactly, or within `rtol`), and the same step names and step values.
    `want` may be a plain dict of arrays, then without steps."""
    assert (list(got) if ordered else sorted(got)) == (list(want) if ordered else sorted(want))
    for key in want:
        assert jax.tree_util.tree_structure(got[key]) == jax.tree_util.tree_structure(want[key]), key
        for g, w in zip(jax.tree_util.tree_leaves(got[key]), jax.tree_util.tree_leaves(want[key]), strict=True):
            g, w = np.asarray(g), np.asarray(w)
            if dtypes:
                assert g.dtype == w.dtype, (key, g.dtype, w.dtype)
            if rtol:
                np.testing.assert_allclose(g, w, rtol=rtol, err_msg=key)
            else:
                np.testing.assert_array_equal(g, w, err_msg=key)
        if not isinstance(want, lox.logdict):
            continue
        names = got.step_names(key), want.step_names(key)
        assert (names[0] if ordered else sorted(names[0])) == (names[1] if ordered else sorted(names[1])), key
        for name in want.step_names(key):
            g, w = np.asarray(got.steps[name][key]), np.asarray(want.steps[name][key])
            if dtypes:
                assert g.dtype == w.dtype, (name, key)
            np.testing.assert_array_equal(g, w, err_msg=f"{name} of {key}")


def logs_of_events(events):
    """The logs that `events` add up to, built by hand (the reference the
    transforms are held to): `events` holds ``(values, steps)`` dict pairs in
    program order; each key's values are stacked, with the steps of each step
    name any of its events carries (:data:`lox.NO_STEP` for those that lack it)."""
    values: dict = {}
    names: dict = {}
    for vals, steps in events:
        for key, v in vals.items():
            values.setdefault(key, []).append((v, steps))
            names.setdefault(key, {}).update(dict.fromkeys(steps))
    data = {key: jax.tree_util.tree_map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *[v for v, _ in held])
            for key, held in values.items()}
    steps = {}
    for key, held in values.items():
        for name in names[key]:
            steps.setdefault(name, {})[key] = np.array([s.get(name, lox.NO_STEP) for _, s in held])
    return lox.logdict(data, steps)


def log_epochs(logger, state, epochs: int = 3) -> None:
    """A jitted spooled loop: `loss` at each of 2 steps per epoch (with `step` and
    `epoch`), `val` once per epoch (with `epoch` only)."""

    def epoch(w, e):
        def step(w, i):
            lox.log({"loss": w}, step=e * 2 + i, epoch=e)
            return w * 0.5, None

        w = jax.lax.scan(step, w, jnp.arange(2))[0]
        lox.log({"val": w + 10.0}, epoch=e)
        return w

    run = jax.jit(logger.spool(epoch, state))
    w = jnp.float32(1.0)
    for e in range(epochs):
        w = run(w, e)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_after_confirmed(proc, count: int = 3, timeout: float = 120.0) -> list[int]:
    """Read the batch numbers `proc` prints as it confirms them, SIGKILL it after
    `count` of them (mid-run), and return them."""
    confirmed = []
    try:
        deadline = time.monotonic() + timeout
        while len(confirmed) < count:
            line = proc.stdout.readline()
            assert line and time.monotonic() < deadline, proc.stderr.read() if not line else "too slow"
            confirmed.append(int(line))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return confirmed


def stop_group(process) -> None:
    """Stop a server started in a process group of its own (SIGTERM, then SIGKILL)."""
    if process is None or process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(15)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def kernels(compiled_text: str) -> list[str]:
    """The sorted opcodes of an optimised HLO module outside fused computations:
    the kernels, copies, loops and conditionals the program runs. (What XLA puts
    inside one fusion runs as one kernel.)"""
    ops, inside_fusion = [], False
    for line in compiled_text.splitlines():
        header = re.match(r"^(ENTRY\s+)?%([\w.\-]+)\s.*\{$", line)
        if header:
            inside_fusion = "fused" in header.group(2) or "wrapped" in header.group(2)
            continue
        op = re.search(r"=\s*[^\s=]+\s+([a-z][\w\-]*)\(", line)
        if op and not inside_fusion and op.group(1) != "parameter":
            ops.append(op.group(1))
    return sorted(ops)


def saved_runs(folder, names=("r",), batches=2):
    """Runs saved by a parquet Logger in `folder`: `batches` batch files of 4 steps each, every run in
    each; their run ids."""
    logger = lox.loggers.from_config(f"parquet:{folder}", name="saved")
    states = [logger.init(name=name) for name in names]
    for batch in range(batches):
        steps = np.arange(batch * 4, batch * 4 + 4)
        for state in states:
            logger.log(state, lox.logdict({"loss": 0.5**steps}, {"step": {"loss": steps}}))
        logger.flush()
    for state in states:
        logger.finish(state)
    logger.close()
    return [run.run_id for run in logger.runs()]


def schema_1_table(run_id: str) -> pa.Table:
    """A table as lox wrote it with schema version 1 (no kind column, no lox.kinds), by hand."""
    dictionary = pa.dictionary(pa.int32(), pa.string())
    fields = pa.schema([pa.field("run", dictionary), pa.field("key", dictionary, nullable=False),
                        pa.field("step", pa.int64()), pa.field("value", pa.float64()), pa.field("dtype", dictionary),
                        pa.field("shape", pa.list_(pa.int32())), pa.field("data", pa.large_binary())],
                       metadata={"lox.schema": "1", "lox.step_dtypes": '{"step": "int64"}',
                                 "lox.step_batch_ndim": "{}", "lox.empty_series": "{}"})
    w = np.arange(4, dtype=np.float32).reshape(2, 2)
    return pa.Table.from_pydict({
        "run": pa.array([run_id] * 4).dictionary_encode(),
        "key": pa.array(["loss", "w", "loss", "w"]).dictionary_encode(),
        "step": [0, 0, 1, 1], "value": [0.5, None, 0.25, None],
        "dtype": pa.array(["float64", "float32"] * 2).dictionary_encode(),
        "shape": [[], [2], [], [2]], "data": [None, w[0].tobytes(), None, w[1].tobytes()],
    }, schema=fields)
