"""Config strings: which backends a Logger writes to.

A config string is a comma-separated list of specs, each ``name``,
``name:target`` or ``name:target?key=value&key=value``::

    console,parquet:runs
    mlflow:http://127.0.0.1:5000?experiment=demo
    wandb?project=demo&mode=offline

The target runs up to the first ``?``; option values are URL-decoded. Secrets
(a password in a URL, options such as ``token`` or ``api_key``) are never shown:
`BackendConfig`'s repr and every error message mask them.
"""

from __future__ import annotations

import dataclasses
import re
import urllib.parse
from typing import NoReturn

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
