"""Config strings: which backends a Logger writes to.

A config string is a comma-separated list of specs, each ``name``,
``name:target`` or ``name:target?key=value&key=value``::

    console,parquet:runs
    mlflow:http://127.0.0.1:5000?experiment=demo
    wandb?project=demo&mode=offline

The target runs up to the first ``?``; option values are URL-decoded. Secrets
(a password in a URL, options such as ``token`` or ``api_key``) are never shown:
`BackendConfig`'s repr and every error message mask them.

Backends declare their options as `Option`s (a backend's `OPTIONS`, see
`lox_backends.plugin.hooks.Backend`); `check_options` types and range-checks
every value when the backend is created, so a mistake is refused where it is
made, naming the backend, the option and what is allowed (and suggesting a
close name for an unknown one).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import re
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, NoReturn

BACKEND_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*")
_OPTION = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_SECRET_OPTION = re.compile(r"token|secret|pass|pwd|key|auth|bearer|credential|signature|sig$", re.IGNORECASE)
# user:password@ in a URL; the password runs to the last "@" before the host.
_URL_PASSWORD = re.compile(r"(?<=://)([^/@:?]*):([^/?]*)@")


class ConfigError(ValueError):
    """A malformed config string; the message points at the offending character."""


@dataclasses.dataclass(frozen=True)
class BackendConfig:
    """One parsed spec: ``name[:target][?options]``."""

    name: str
    target: str | None = None
    options: dict[str, str] = dataclasses.field(default_factory=dict)

    def __repr__(self) -> str:
        return f"BackendConfig({mask_secrets(str(self))!r})"

    def __str__(self) -> str:
        text = self.name + (f":{self.target}" if self.target is not None else "")
        if self.options:
            text += "?" + "&".join(f"{k}={urllib.parse.quote(v, safe='')}" for k, v in self.options.items())
        return text


def mask_secrets(text: str) -> str:
    """`text` with passwords in URLs and secret option values replaced by ``*``
    of the same length (so that positions in error messages still line up)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{'*' * len(m.group(2))}@", text)

    def mask_option(m: re.Match) -> str:
        key, value = m.group(1), m.group(2)
        return f"{key}={'*' * len(value)}" if _SECRET_OPTION.search(key) else m.group(0)

    return re.sub(r"(?<=[?&])([^=&,?]+)=([^&,]*)", mask_option, text)


def parse(text: str) -> list[BackendConfig]:
    """Parse a config string into one `BackendConfig` per spec.

    >>> [str(c) for c in parse("console,parquet:runs")]
    ['console', 'parquet:runs']
    >>> parse("mlflow:http://127.0.0.1:5000?experiment=demo")[0].options
    {'experiment': 'demo'}
    >>> parse("wandb?project=demo&mode=offline")[0].target is None
    True
    """
    if not isinstance(text, str):
        raise TypeError(f"a lox config string must be a str, got {type(text).__name__}.")
    configs, start = [], 0
    for spec in text.split(","):
        configs.append(_parse_spec(text, spec, start))
        start += len(spec) + 1
    return configs


def _parse_spec(text: str, spec: str, start: int) -> BackendConfig:
    stripped = spec.strip()
    offset = start + (len(spec) - len(spec.lstrip()))
    if not stripped:
        _fail(text, offset, "an empty backend spec (two commas in a row, or a comma at an end)")
    name_match = BACKEND_NAME.match(stripped)
    if name_match is None:
        _fail(text, offset, "a backend name must start with a letter")
    name = name_match.group(0)
    rest, pos = stripped[len(name):], offset + len(name)
    target = None
    if rest.startswith(":"):
        target, _, query = rest[1:].partition("?")
        if not target:
            _fail(text, pos + 1, f"backend {name!r} has ':' but no target after it")
        query_pos = pos + 1 + len(target) + 1
        has_query = "?" in rest
    elif rest.startswith("?"):
        query, query_pos, has_query = rest[1:], pos + 1, True
    elif rest:
        _fail(text, pos, f"unexpected {rest[0]!r} after backend name {name!r} (expected ':', '?' or ',')")
    else:
        query, query_pos, has_query = "", pos, False
    options: dict[str, str] = {}
    if has_query:
        if not query:
            _fail(text, query_pos, f"backend {name!r} has '?' but no options after it")
        for pair in query.split("&"):
            key, eq, value = pair.partition("=")
            if not eq or _OPTION.fullmatch(key) is None:
                _fail(text, query_pos, f"option {pair!r} of backend {name!r} is not key=value")
            if key in options:
                _fail(text, query_pos, f"option {key!r} of backend {name!r} is given twice")
            options[key] = urllib.parse.unquote(value)
            query_pos += len(pair) + 1
    return BackendConfig(name, target, options)


def _fail(text: str, position: int, reason: str) -> NoReturn:
    shown = mask_secrets(text)
    raise ConfigError(f"invalid lox config: {reason}, at character {position + 1}:\n    {shown}\n    {' ' * position}^")


# --- backend options ---------------------------------------------------------------------
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


KINDS = ("text", "int", "float", "flag", "choice")  # what an Option's value is parsed as


def _of_kind(value: Any, option: Option) -> bool:
    """Whether a default value is of `option`'s kind (its range is the backend's business)."""
    if option.kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if option.kind == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if option.kind == "flag":
        return isinstance(value, bool)
    if option.kind == "choice":
        return isinstance(value, str) and value.lower() in option.choices
    return isinstance(value, str)


@dataclasses.dataclass(frozen=True)
class Option:
    """One ``?key=value`` option of a backend: what it does (`help`, shown in
    messages), its `kind` (``"text"``, ``"int"``, ``"float"``, ``"flag"`` or
    ``"choice"``), its `default` (None: the backend decides, e.g. from an
    environment variable), the range an int or float must be in
    (`minimum`/`maximum`, inclusive), the values of a choice (`choices`,
    compared case-insensitively), and `check`: a function of the typed value
    that returns why it is refused (None when it is fine)."""

    help: str
    kind: str = "text"
    default: Any = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    check: Callable[[Any], str | None] | None = None

    def __post_init__(self) -> None:
        # A declaration mistake shows where the backend is defined, not as an untyped value later.
        if self.kind not in KINDS:
            raise ValueError(f"an Option's kind is one of {', '.join(KINDS)}; got {self.kind!r} (for {self.help!r}).")
        if (self.kind == "choice") != bool(self.choices):
            raise ValueError(f"an Option of kind 'choice' takes its `choices`, and only such an Option does "
                             f"(for {self.help!r}: kind {self.kind!r}, choices {self.choices!r}).")
        if self.default is not None and not _of_kind(self.default, self):
            raise ValueError(f"the default {self.default!r} of an Option of kind {self.kind!r} is not "
                             f"{self.allowed()} (for {self.help!r}).")

    def allowed(self) -> str:
        """What a value may be, in words."""
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "flag":
            return "1, true, yes, on or 0, false, no, off"
        if self.kind in ("int", "float"):
            what = "an integer" if self.kind == "int" else "a number"
            if self.minimum is not None and self.maximum is not None:
                return f"{what} from {self.minimum:g} to {self.maximum:g}"
            if self.minimum is not None:
                return f"{what} >= {self.minimum:g}"
            if self.maximum is not None:
                return f"{what} <= {self.maximum:g}"
            return what
        return "text"

    def describe(self) -> str:
        """What the option does, what it may be and its default, in words."""
        text = self.help + (f": {self.allowed()}" if self.kind != "text" else "")
        if self.default is not None:
            shown = {True: "1", False: "0"}.get(self.default, self.default) if self.kind == "flag" else self.default
            text += f"; default {shown:g}" if isinstance(shown, float) else f"; default {shown}"
        return text

    def _refusal(self) -> str:
        return f"it must be {self.allowed()}"

    def parse(self, value: str) -> Any:
        """`value` typed; `ValueError` with what is allowed when it is not."""
        if self.kind == "int":
            try:
                typed: Any = int(value.strip())
            except ValueError:
                raise ValueError(self._refusal()) from None
        elif self.kind == "float":
            try:
                typed = float(value.strip())
            except ValueError:
                raise ValueError(self._refusal()) from None
            if not math.isfinite(typed):
                raise ValueError(self._refusal())
        elif self.kind == "flag":
            lowered = value.strip().lower()
            if lowered not in _TRUE + _FALSE:
                raise ValueError(self._refusal())
            typed = lowered in _TRUE
        elif self.kind == "choice":
            typed = value.strip().lower()
            if typed not in self.choices:
                raise ValueError(self._refusal())
        else:
            typed = value
        if (self.minimum is not None and typed < self.minimum) or (self.maximum is not None and typed > self.maximum):
            raise ValueError(self._refusal())
        refused = self.check(typed) if self.check is not None else None
        if refused:
            raise ValueError(refused)
        return typed


def check_options(
    backend: str, options: Mapping[str, str], specs: Mapping[str, Option], example: str
) -> dict[str, Any]:
    """The `options` of `backend` checked against its `specs` and typed, with the
    defaults of the options not given. Raises `ValueError` naming the backend,
    the option, the value and what is allowed; for an unknown option, the close
    names and the options there are. `example` is a config string that works
    (shown in the messages; none when empty). `hooks.Backend.__init__` calls it
    with the backend's `OPTIONS` and `EXAMPLE`.

    >>> check_options("demo", {"every": "5"}, {"every": Option("seconds", "float", 1.0, minimum=0)}, "demo?every=5")
    {'every': 5.0}
    >>> check_options("demo", {"evrey": "5"}, {"every": Option("s")}, "demo")
    Traceback (most recent call last):
    ...
    ValueError: the demo backend has no option 'evrey'; did you mean 'every'? Its options are: every (s). E.g. 'demo'.
    """
    shown_example = f" E.g. {example!r}." if example else ""
    for name in options:
        if name not in specs:
            close = difflib.get_close_matches(name, list(specs), n=1, cutoff=0.6)
            listed = "; ".join(f"{key} ({spec.describe()})" for key, spec in specs.items())
            if close:
                raise ValueError(
                    f"the {backend} backend has no option {name!r}; did you mean {close[0]!r}? "
                    f"Its options are: {listed}.{shown_example}"
                )
            if not specs:
                raise ValueError(f"the {backend} backend has no options (got {name!r}).{shown_example}")
            raise ValueError(f"the {backend} backend has no option {name!r}; its options are: {listed}.{shown_example}")
    typed = {name: spec.default for name, spec in specs.items()}
    for name, value in options.items():
        try:
            typed[name] = specs[name].parse(value)
        except ValueError as e:
            shown = "*" * len(value) if _SECRET_OPTION.search(name) else value
            raise ValueError(
                f"the {backend} backend's option {name}={shown!r} is refused: {e} "
                f"({specs[name].help}).{shown_example}"
            ) from None
    return typed


# --- Logger options ------------------------------------------------------------------------
def check_logger_options(
    timeout: Any, flush_every: Any, max_pending: Any, on_error: Any, on_error_choices: tuple[str, ...]
) -> tuple[float, float, int]:
    """The options a `Logger` takes besides its backends, checked where the
    Logger is made (`from_config`, `backend_logger`, `SaveLogger` pass them on):
    `timeout` and `flush_every` are seconds (a finite number > 0, NumPy numbers
    too), `max_pending` bytes (an int > 0), `on_error` one of
    `on_error_choices`. Returns ``(timeout, flush_every, max_pending)`` as
    Python numbers; `TypeError` / `ValueError` naming the option, the value
    and what to pass.

    >>> check_logger_options(30, 5, 2**20, "raise", ("raise", "warn"))
    (30.0, 5.0, 1048576)
    >>> check_logger_options(30, "5", 2**20, "raise", ("raise", "warn"))
    Traceback (most recent call last):
    ...
    TypeError: a lox Logger's `flush_every` is a number of seconds (how often the backends are flushed), \
got '5' (a str); pass a number, e.g. flush_every=5.0.
    """
    timeout = seconds("timeout", timeout, "how long `finish`, `flush` and `close` wait for a slow backend", 60)
    flush_every = seconds("flush_every", flush_every, "how often the backends are flushed", 5.0)
    what = "how many bytes of logs a failing backend may hold unwritten, to retry, before the Logger acts on it"
    example = "e.g. max_pending=256 * 2**20 (256 MiB, the default)"
    # bool is an int to Python, but `max_pending=True` is a mistake, not 1 byte.
    if isinstance(max_pending, bool) or not isinstance(max_pending, numbers.Integral):
        raise TypeError(
            f"a lox Logger's `max_pending` is a number of bytes ({what}), got {max_pending!r} "
            f"(a {type(max_pending).__name__}); pass an int, {example}."
        )
    if max_pending <= 0:
        raise ValueError(
            f"a lox Logger's `max_pending` is a number of bytes > 0 ({what}), got {max_pending!r}; pass {example}."
        )
    if not isinstance(on_error, str) or on_error not in on_error_choices:
        raise ValueError(
            f"a lox Logger's `on_error` is {' or '.join(map(repr, on_error_choices))}, got {on_error!r}: "
            "'raise' (the default) stops training with an error at the next logger call once the local log "
            "cannot write and `max_pending` is spent; 'warn' warns and keeps training without those logs."
        )
    return timeout, flush_every, int(max_pending)


def check_system(system: Any) -> float | None:
    """A Logger's ``system``: seconds between samples of system metrics
    (`lox_backends.logger.system`), a finite number > 0, or None (off).

    >>> check_system(None), check_system(10)
    (None, 10.0)
    >>> check_system(0)
    Traceback (most recent call last):
    ...
    ValueError: a lox Logger's `system` is a finite number of seconds > 0 (how often system metrics are \
sampled; None: never), got 0; pass e.g. system=10.0.
    """
    if system is None:
        return None
    if isinstance(system, numbers.Real) and not isinstance(system, bool) and float(system) == math.inf:
        raise ValueError("a lox Logger's `system` is a finite number of seconds > 0 (how often system metrics are "
                         "sampled), got inf; pass system=None (the default) for no system metrics.")
    return seconds("system", system, "how often system metrics are sampled; None: never", 10.0)


def check_media_limit(limit: Any, default: int) -> dict[str, int]:
    """A Logger's ``media_limit`` (the bytes one event of a key of images,
    video, audio, histograms or text may hold) as a dict from keys to bytes,
    ``"*"`` for every other key: an int applies to every key; a dict gives
    keys limits of their own (`default` for the others, unless it names ``"*"``).

    >>> check_media_limit(2**20, 64)
    {'*': 1048576}
    >>> check_media_limit({"rollout": 2**30}, 64)
    {'rollout': 1073741824, '*': 64}
    """
    example = 'e.g. media_limit=256 * 2**20, or media_limit={"rollout": 2**30} for one key'
    if isinstance(limit, Mapping):
        limits = {**dict(limit)}
        limits.setdefault("*", default)
    else:
        limits = {"*": limit}
    for key, value in limits.items():
        if not isinstance(key, str):
            raise TypeError(f"a lox Logger's `media_limit` maps keys (str) to bytes, got the key {key!r}; {example}.")
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
            which = "" if key == "*" and not isinstance(limit, Mapping) else f" for key {key!r}"
            raise ValueError(
                f"a lox Logger's `media_limit`{which} is a number of bytes > 0 (the most one event of a key of "
                f"images, video, audio, histograms or text may hold), got {value!r}; {example}."
            )
        limits[key] = int(value)
    return limits


def seconds(option: str, value: Any, what: str, example: float) -> float:
    """`value` of the Logger option `option` (`what` it sets) as seconds: a
    finite number > 0 (a bool, a str, None, NaN and infinity are refused, as
    every wait is bounded). `example` is shown in the message."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(
            f"a lox Logger's `{option}` is a number of seconds ({what}), got "
            + ("None (every wait is bounded)" if value is None else f"{value!r} (a {type(value).__name__})")
            + f"; pass a number, e.g. {option}={example!r}."
        )
    typed = float(value)
    if not math.isfinite(typed) or typed <= 0:
        instead = f"a large number, e.g. {option}=3600" if typed == math.inf else f"e.g. {option}={example!r}"
        raise ValueError(
            f"a lox Logger's `{option}` is a finite number of seconds > 0 ({what}), got {value!r}; pass {instead}."
        )
    return typed
