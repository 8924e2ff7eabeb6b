"""Finding backends: pluggy plugins declared through the entry-point group ``lox``.

Plugins load lazily, the first time a backend is looked up (never at
``import lox``). lox's own backends are plugins of its package, ``jax-lox``,
declared in its ``pyproject.toml`` and found like any other: a lox that runs
from a source tree without being installed finds none, and says to install it
(`NotInstalled`). ``LOX_DISABLE_PLUGIN_AUTOLOAD=1`` loads only lox's own
plugins. The hook is called through pluggy, one plugin at a time: a plugin
that fails to load, or whose hook raises, is skipped with a warning and the
others work. Two packages that claim one backend name make that name an error
that names both packages.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.metadata
import os
import pathlib
import threading
import warnings
from collections.abc import Iterable

import pluggy

from lox_backends.plugin import hooks
from lox_backends.plugin.config import BACKEND_NAME, BackendConfig, mask_secrets

OWN_DISTRIBUTION = "jax-lox"


class NotInstalled(RuntimeError):
    """lox runs from a source tree without being installed: its own backends,
    entry points of the ``jax-lox`` package, cannot be found."""


class BackendNotFound(LookupError):
    """A config string names a backend that no installed plugin provides."""


class BackendUnavailable(ImportError):
    """The backend is known but its dependencies (its extra) are missing."""


class PluginConflict(LookupError):
    """Two installed packages claim the same backend name."""


@dataclasses.dataclass(frozen=True)
class Offer:
    """A backend as offered by one installed package."""

    spec: hooks.BackendSpec
    package: str


def _normalise(name: str) -> str:
    return name.lower().replace("_", "-")


class Registry:
    """The plugin manager and the backends its plugins offer."""

    def __init__(self):
        self._lock = threading.RLock()  # re-entered only to report a plugin that recurses
        self._discovering = False
        self._offers: dict[str, list[Offer]] | None = None
        self._failed: list[tuple[str, str, Exception]] = []  # the plugins skipped (plugin, package, error): `lookup`
        self.plugin_manager = pluggy.PluginManager(hooks.PROJECT)
        self.plugin_manager.add_hookspecs(hooks.Hooks)

    @property
    def loaded(self) -> bool:
        """Whether plugins have been discovered yet (they are, on first lookup)."""
        return self._offers is not None

    def _load(self) -> dict[str, list[Offer]]:
        with self._lock:
            if self._offers is None:
                if self._discovering:
                    raise RuntimeError(
                        "a lox plugin looked up lox's backends while it was being imported (e.g. "
                        "`from lox.loggers import ...` at the top of the plugin module); import lox.loggers "
                        "inside the plugin's functions instead."
                    )
                self._discovering = True
                try:
                    self._offers = self._discover()
                finally:
                    self._discovering = False
            return self._offers

    def _discover(self) -> dict[str, list[Offer]]:
        autoload = os.environ.get("LOX_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() not in ("1", "true", "yes")
        entry_points = [
            (ep, ep.dist.name if ep.dist is not None else "<unknown package>")
            for ep in importlib.metadata.entry_points(group=hooks.PROJECT)
        ]
        if not any(_own_package(package) for _, package in entry_points):
            raise NotInstalled(_not_installed_message())
        self._failed = []
        packages: dict[str, str] = {}  # pluggy plugin name → distribution
        seen = set()
        for ep, package in entry_points:
            if (not autoload and not _own_package(package)) or (package, ep.value) in seen:
                continue
            seen.add((package, ep.value))
            plugin_name = f"{package}:{ep.name}"
            if self.plugin_manager.has_plugin(plugin_name):
                continue
            try:
                plugin = ep.load()
            except Exception as error:  # noqa: BLE001 - one broken plugin must not take the others down
                self._skip(ep.name, package, error)
                continue
            try:
                self.plugin_manager.register(plugin, name=plugin_name)
            except Exception as error:  # noqa: BLE001 - e.g. a hook with a wrong signature
                self._skip(ep.name, package, error)
                continue
            packages[plugin_name] = package
        offers: dict[str, list[Offer]] = {}
        for plugin_name, plugin in self.plugin_manager.list_name_plugin():
            if plugin is None:  # a name blocked in the plugin manager
                continue
            package = packages.get(plugin_name, plugin_name)
            try:
                _add_offers(offers, self._call_hook(plugin_name), plugin_name, package)
            except Exception as error:  # noqa: BLE001 - a hook that raises or returns nonsense
                self.plugin_manager.unregister(name=plugin_name)
                self._skip(plugin_name.partition(":")[2] or plugin_name, package, error)
        return dict(sorted(offers.items()))

    def _call_hook(self, plugin_name: str) -> list:
        """What the `lox_backends` hook of one plugin returns, called through
        pluggy with that plugin alone (so that one raising costs only its own)."""
        plugin = self.plugin_manager.get_plugin(plugin_name)
        others = [p for p in self.plugin_manager.get_plugins() if p is not plugin]
        return self.plugin_manager.subset_hook_caller("lox_backends", remove_plugins=others)()

    def _skip(self, plugin: str, package: str, error: Exception) -> None:
        """Warn that a plugin is skipped, and remember it for `lookup`'s message."""
        self._failed.append((plugin, package, error))
        warnings.warn(
            f"lox: the plugin {plugin!r} of package {package} failed to load and is skipped: {error!r}. "
            f"Reinstall or uninstall {package}, or tell its author.",
            RuntimeWarning,
            stacklevel=4,
        )

    def register(self, plugin, name: str | None = None) -> None:
        """Register a plugin object directly (for code that is not installed as a
        package, e.g. a notebook); installed plugins are found on their own."""
        offers = self._load()
        with self._lock:
            plugin_name = self.plugin_manager.register(plugin, name=name)
            if plugin_name is None:  # blocked in the plugin manager
                return
            try:
                _add_offers(offers, self._call_hook(plugin_name), plugin_name, f"<registered {plugin_name}>")
            except BaseException:
                self.plugin_manager.unregister(name=plugin_name)  # so that a fixed one can be registered again
                raise

    def offers(self) -> dict[str, list[Offer]]:
        """Every backend name with the packages that offer it."""
        return {name: list(found) for name, found in self._load().items()}

    def lookup(self, name: str, config: BackendConfig | None = None) -> hooks.BackendSpec:
        """The spec of backend `name`, checked: known, unambiguous, installable."""
        offers = self._load()
        found = offers.get(name)
        where = f" in {mask_secrets(str(config))!r}" if config is not None else ""
        if not found:
            known = ", ".join(_listed(known, offered) for known, offered in offers.items()) or "none"
            close = difflib.get_close_matches(name, offers, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            for plugin, package, error in self._failed:
                if _normalise(plugin) == _normalise(name):  # installed, but its plugin could not be loaded
                    raise BackendNotFound(
                        f"the lox backend {name!r}{where} is offered by the plugin {plugin!r} of package {package}, "
                        f"which failed to load and was skipped: {error!r}. Upgrade or reinstall {package}, or tell "
                        "its author."
                    )
            skipped = "; ".join(f"the plugin {plugin!r} of package {package} ({error!r})"
                                for plugin, package, error in self._failed)
            failed = f" Skipped, as they failed to load: {skipped}." if skipped else ""
            raise BackendNotFound(
                f"unknown lox backend {name!r}{where}.{hint} Installed backends: {known}. "
                "Run `lox backends` to list them with their packages; a third-party backend is "
                f"found once its package is installed.{failed}"
            )
        if len(found) > 1:
            packages = " and ".join(sorted(o.package for o in found))
            raise PluginConflict(
                f"the lox backend name {name!r} is claimed by two packages: {packages}. "
                "Uninstall one of them (pip uninstall ...), or ask its author to rename the backend."
            )
        spec = found[0].spec
        missing = spec.missing()
        if missing:
            how = spec.install_hint()
            raise BackendUnavailable(
                f"the lox backend {name!r} needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                f"not installed: run `{how}`."
            )
        return spec

    def create(self, config: BackendConfig) -> hooks.Backend:
        """A backend instance for one parsed spec."""
        spec = self.lookup(config.name, config)
        backend = spec.load()(config.target, dict(config.options))
        target = "" if config.target is None else f":{config.target}"
        options = "".join(f"{'&' if i else '?'}{k}={v}" for i, (k, v) in enumerate(config.options.items()))
        try:  # as written in the config string (not URL-quoted): what names it in messages
            backend.config = mask_secrets(f"{config.name}{target}{options}")
        except AttributeError:  # a backend class with __slots__: named by its class instead
            pass
        return backend


def _listed(name: str, offers: list[Offer]) -> str:
    """A backend name as error messages list it: marked when its extra is missing."""
    missing = [offer.spec for offer in offers if offer.spec.missing()]
    return f"{name} (needs: {missing[0].install_hint()})" if len(missing) == len(offers) else name


def _own_package(package: str) -> bool:
    """Whether `package` (a distribution name) is lox's own."""
    return _normalise(package) == OWN_DISTRIBUTION


def _not_installed_message() -> str:
    """What to do when no entry point of lox's own package is found."""
    source = pathlib.Path(__file__).resolve().parents[2]
    return (
        f"lox finds its own backends (console, parquet, ...) like any plugin, through the entry points of its "
        f"package, {OWN_DISTRIBUTION}, and none are installed: this lox runs from a source tree ({source}) "
        f"without being installed (or was installed before its backends were plugins). Install it: "
        f"`pip install -e .` in {source}."
    )


def _add_offers(offers: dict[str, list[Offer]], results: list, plugin_name: str, package: str) -> None:
    """Validate everything a plugin's hook returned (`results`: pluggy's list of
    its one return value, empty for None) before adding any of it."""
    specs = []
    for result in results:
        if isinstance(result, (str, bytes, hooks.BackendSpec)) or not isinstance(result, Iterable):
            raise TypeError(
                f"the lox plugin {plugin_name!r} (package {package}) returned {result!r} from lox_backends(); "
                "return a list of lox_backends.hooks.BackendSpec."
            )
        specs.extend(result)
    for spec in specs:
        if not isinstance(spec, hooks.BackendSpec):
            raise TypeError(
                f"the lox plugin {plugin_name!r} (package {package}) returned {spec!r} from "
                "lox_backends(); return a list of lox_backends.hooks.BackendSpec."
            )
        if not BACKEND_NAME.fullmatch(spec.name):
            raise ValueError(
                f"the lox plugin {plugin_name!r} (package {package}) offers a backend named {spec.name!r}, "
                "which no config string can name: use letters, digits, '_', '.' and '-', starting with a letter."
            )
    for spec in specs:
        offers.setdefault(spec.name, []).append(Offer(spec, package))


registry = Registry()
