"""What `lox.log` does when no lox transform is around it: print the event."""

from __future__ import annotations

import os
import sys
import threading

import numpy as np

from lox_core import _compat
from lox_core.media import Histogram, Media, is_text

_MODES = ("console", "off")
_initial = os.environ.get("LOX_DEFAULT", "console").strip().lower() or "console"
if _initial not in _MODES:
    raise ValueError(f"LOX_DEFAULT={_initial!r} is not a valid setting: use one of {', '.join(_MODES)}.")
_compat.set_default_output(_initial)


def set_default(mode: str) -> None:
    """Choose what `lox.log` does outside `spool`/`tap`/`nolog`.

    ``"console"`` (the default) prints each event; ``"off"`` does nothing:
    a `jax.jit` of code that logs then compiles to what it would without the
    logs and dispatches as fast (`spool`, `tap` and `nolog` still see every
    log). The environment variable ``LOX_DEFAULT`` sets the initial value.
    The setting applies to functions compiled before it too: JAX traces and
    compiles a jitted function again at its next call after the default
    changed (once per setting; the compiled versions stay cached).

    >>> import lox
    >>> lox.set_default("off")
    >>> lox.set_default("console")
    """
    if mode not in _MODES:
        raise ValueError(f"unknown default {mode!r}: use one of {', '.join(_MODES)}.")
    _compat.set_default_output(mode)


def default_enabled() -> bool:
    return _compat.default_output_state.value == "console"


# Devices call back from threads of their own (inside `shard_map`): one whole line at a time.
_print_lock = threading.Lock()


def default_output(site, operands) -> None:
    if not default_enabled():
        return
    values, steps = site.split([np.asarray(x) for x in operands])
    print_event(values, steps)


def print_event(values: dict, steps: dict) -> None:
    """Print one event on a line of its own."""
    line = format_event(values, steps) + "\n"
    with _print_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def format_event(values: dict, steps: dict) -> str:
    """One line per event: ``[step=3 episode=1] loss=0.25 w=[1. 2.]``."""
    head = " ".join(f"{name}={int(np.asarray(s).reshape(-1)[0]) if np.size(s) == 1 else np.asarray(s).tolist()}"
                    for name, s in steps.items())
    body = " ".join(f"{k}={_format_value(v)}" for k, v in values.items())
    return f"[{head}] {body}" if head else body


def _format_value(value) -> str:
    if isinstance(value, Media):
        return media_summary(value)
    if is_text(value):
        return _text_summary(np.asarray(value))
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_format_value(v) for v in value) + ")"
    arr = np.asarray(value)
    if arr.ndim == 0:
        return f"{arr.item():.6g}" if arr.dtype.kind == "f" else str(arr.item())
    return np.array2string(arr, precision=6, threshold=20)


def media_summary(value: Media, event_ndim: int = 0) -> str:
    """A kind's value in a few words: ``image uint8[4, 28, 28, 1]``,
    ``video float32[8, 64, 64, 3] at 10 fps``, ``histogram of 1000 in [-3.2, 3.1]``.
    `event_ndim`: leading axes (events, runs) left out of the shape."""
    if isinstance(value, Histogram):
        counts, edges = np.asarray(value.counts), np.asarray(value.edges)
        if counts.ndim == 1 and edges.size and np.issubdtype(counts.dtype, np.number):
            return f"histogram of {int(counts.sum())} in [{_scalar(float(edges[0]))}, {_scalar(float(edges[-1]))}]"
        return f"histogram {counts.dtype.name}{list(counts.shape[event_ndim:])}"
    (array,) = value.arrays.values()
    options = "".join(f" at {v:g} fps" if k == "fps" else f" at {v} Hz" if k == "rate" else ""
                      for k, v in value.options.items())
    return f"{value.kind} {np.dtype(array.dtype).name}{list(np.shape(array)[event_ndim:])}{options}"


def _text_summary(text: np.ndarray, width: int = 60) -> str:
    if text.ndim == 0:
        line = " ".join(str(text).split())
        return repr(line if len(line) <= width else line[: width - 1] + "…")
    if text.ndim == 1 and text.size <= 4:  # a few texts (a logdict's events of one str): each abbreviated
        return "[" + ", ".join(_text_summary(np.asarray(t), 24) for t in text) + "]"
    return f"text{list(text.shape)}"


def show(value) -> str:
    """A value as `print(event)` and `print(logs)` show it: a pytree of NumPy
    values, floats to 4 significant digits and large arrays abbreviated, as
    NumPy prints them (``0.5``, ``1.0``, ``[0, 1, 2]``, ``{'w': [1.5, 2.0]}``)."""
    if isinstance(value, str):  # already shown (a logdict's array with its dtype and shape)
        return value
    if isinstance(value, Media):
        return media_summary(value)
    if is_text(value):
        return _text_summary(np.asarray(value))
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        inner = ", ".join(show(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner}{',' if len(value) == 1 else ''})"
    arr = np.asarray(value)
    if arr.ndim == 0:
        return _scalar(arr.item())
    text = np.array2string(arr, separator=", ", threshold=8, edgeitems=3, formatter={"all": _scalar})
    return " ".join(text.split())  # one line: rows of a matrix too


def _scalar(x) -> str:
    if isinstance(x, str):  # a placeholder, such as `-` for a step an event did not carry
        return x
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float):
        text = f"{x:.4g}"
        return text + ".0" if text.lstrip("-").isdigit() else text
    if isinstance(x, complex):
        return f"{_scalar(x.real)}{'+' if x.imag >= 0 else '-'}{_scalar(abs(x.imag))}j"
    return repr(x)
