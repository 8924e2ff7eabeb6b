"""Backends are pluggy plugins found through the entry-point group ``lox``."""

import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import tomllib

import pytest

import lox
from lox_backends import hooks
from lox_backends.plugin.config import BackendConfig
from lox_backends.plugin.registry import BackendNotFound, BackendUnavailable, NotInstalled, Registry, registry

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_builtin_backends_are_the_entry_points_pyproject_declares():
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"]["lox"]
    assert sorted(declared) == ["console", "memory", "mlflow", "neptune", "parquet", "tensorboard", "wandb"]
    ours = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="lox") if ep.dist.name == "jax-lox"}
    assert ours == declared  # the installed metadata is that of this source tree
    offers = registry.offers()
    for name in declared:
        assert [o.package for o in offers[name]] == ["jax-lox"]


def test_lox_run_from_a_source_tree_without_being_installed_says_to_install_it(monkeypatch):
    """Without jax-lox's entry points (lox imported from a source folder on sys.path), no
    backend can be found, lox's own included: every lookup says what to run."""
    found = importlib.metadata.entry_points(group="lox")
    others = importlib.metadata.EntryPoints(ep for ep in found if ep.dist.name != "jax-lox")
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kwargs: others)
    fresh = Registry()
    message = (
        "lox finds its own backends (console, parquet, ...) like any plugin, through the entry points of its "
        f"package, jax-lox, and none are installed: this lox runs from a source tree ({ROOT}) without being "
        f"installed (or was installed before its backends were plugins). Install it: `pip install -e .` in {ROOT}."
    )
    for lookup in (fresh.offers, lambda: fresh.lookup("memory"), lambda: fresh.create(BackendConfig("memory"))):
        with pytest.raises(NotInstalled, match=f"^{re.escape(message)}$"):
            lookup()
    assert not fresh.loaded
    monkeypatch.setenv("LOX_DISABLE_PLUGIN_AUTOLOAD", "1")
    with pytest.raises(NotInstalled):
        fresh.lookup("memory")


@pytest.mark.parametrize("tracker", ["mlflow", "wandb", "neptune", "tensorboard"])
def test_trackers_name_their_extra_and_import_nothing_until_used(tracker):
    """Listing backends imports no tracker client; each names its extra."""
    code = (
        "import sys; from lox_backends.plugin.registry import registry; spec = registry.lookup(%r); "
        "print(spec.install, any(m.split('.')[0] in ('mlflow', 'wandb', 'neptune', 'tensorboardX') "
        "for m in sys.modules))" % tracker
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["pip", "install", f"'jax-lox[{tracker}]'", "False"]


def test_import_lox_loads_no_plugin():
    code = (
        "import sys, lox; from lox_backends.plugin.registry import registry; "
        "print(registry.loaded, any(m in sys.modules for m in ('lox_backends.memory', 'lox_backends.trackers.mlflow')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
    code = (
        "import lox; from lox_backends.plugin.registry import registry; lox.loggers.from_config('memory'); "
        "print(registry.loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_unknown_backend_lists_the_installed_ones_and_suggests():
    with pytest.raises(
        BackendNotFound,
        match=r"unknown lox backend 'parqet'.*Did you mean 'parquet'\?.*Installed backends: .*console.*memory.*parquet",
    ):
        lox.loggers.from_config("console,parqet:runs")


def test_missing_extra_names_the_pip_command():
    class Plugin:
        @hooks.hookimpl
        def lox_backends(self):
            return [
                hooks.BackendSpec(
                    "needs-x", "nowhere:Backend", requires=("lox_no_such_module",), install="pip install 'jax-lox[x]'"
                )
            ]

    fresh = Registry()
    fresh.register(Plugin(), name="needs-x-plugin")
    with pytest.raises(
        BackendUnavailable,
        match=r"'needs-x' needs lox_no_such_module, which is not installed: run `pip install 'jax-lox\[x\]'`",
    ):
        fresh.create(BackendConfig("needs-x"))


def test_a_plugin_returning_something_else_is_named():
    class Broken:
        @hooks.hookimpl
        def lox_backends(self):
            return ["console"]

    with pytest.raises(TypeError, match=r"'broken'.*returned 'console'.*BackendSpec"):
        Registry().register(Broken(), name="broken")


def _install_fake_distribution(root, dist, module, backend_name, hook=None, before=""):
    """A real installed distribution (dist-info with an entry point), as pip would lay it out. Its
    hook returns one backend named `backend_name`, or runs `hook` (a line) after `before` (lines)."""
    hook = hook or f"return [hooks.BackendSpec({backend_name!r}, hooks.Backend, description='from {dist}')]"
    (root / f"{module}.py").write_text(
        f"from lox_backends import hooks\n{textwrap.dedent(before)}\n@hooks.hookimpl\ndef lox_backends():\n    {hook}\n"
    )
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[lox]\n{module} = {module}\n")


def _run(code, root, **env):
    environment = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *sys.path]), **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment)


def test_two_packages_claiming_one_name_is_an_error_naming_both(tmp_path):
    _install_fake_distribution(tmp_path, "lox-clash-one", "lox_clash_one", "clash")
    _install_fake_distribution(tmp_path, "lox-clash-two", "lox_clash_two", "clash")
    result = _run("import lox; lox.loggers.from_config('clash')", tmp_path)
    assert result.returncode != 0
    assert "PluginConflict" in result.stderr
    assert "'clash' is claimed by two packages: lox-clash-one and lox-clash-two" in result.stderr
    # Other backends still work, and `lox backends` shows the conflict.
    ok = _run("import lox; print(lox.loggers.from_config('memory').backends[0].__class__.__name__)", tmp_path)
    assert ok.stdout.strip() == "MemoryBackend", ok.stderr
    listed = _run("from lox_backends.tools.cli import main; main(['backends'])", tmp_path).stdout
    assert "clash" in listed and "conflict: also claimed by lox-clash-two" in listed


def test_autoload_can_be_turned_off_for_third_party_plugins(tmp_path):
    _install_fake_distribution(tmp_path, "lox-extra-backend", "lox_extra_backend", "extra-one")
    code = "import lox; lox.loggers.from_config('extra-one'); print('found')"
    assert _run(code, tmp_path).stdout.strip() == "found"
    off = _run(code, tmp_path, LOX_DISABLE_PLUGIN_AUTOLOAD="1")
    assert "unknown lox backend 'extra-one'" in off.stderr
    # lox's own backends stay available.
    builtin = "import lox; lox.loggers.from_config('memory'); print('ok')"
    assert _run(builtin, tmp_path, LOX_DISABLE_PLUGIN_AUTOLOAD="1").stdout.strip() == "ok"


def test_named_logger_constructors_exist_for_every_backend(tmp_path):
    logger = lox.loggers.ParquetLogger(str(tmp_path / "runs"))
    assert type(logger.backends[0]).__name__ == "ParquetBackend"
    assert type(lox.loggers.MemoryLogger().backends[0]).__name__ == "MemoryBackend"
    with pytest.raises(AttributeError, match="NoSuchLogger"):
        lox.loggers.NoSuchLogger()


def test_a_plugin_that_fails_to_import_is_skipped_with_a_warning_naming_its_package(tmp_path):
    _install_fake_distribution(tmp_path, "lox-broken", "lox_broken", "broken")
    (tmp_path / "lox_broken.py").write_text("import lox_module_that_is_not_installed\n")
    result = _run("import lox; lox.loggers.from_config('memory'); print('still works')", tmp_path)
    assert result.stdout.strip() == "still works"
    assert "the plugin 'lox_broken' of package lox-broken failed to load and is skipped" in result.stderr
    assert "ModuleNotFoundError" in result.stderr


def test_a_plugin_written_for_an_earlier_lox_is_skipped_and_its_backend_says_why(tmp_path):
    _install_fake_distribution(tmp_path, "lox-old", "lox_old", "old", "return [hooks.BackendSpec('old', OldBackend)]",
                               before="""
                                   class OldBackend(hooks.Backend):
                                       def write_batch(self, run, table):
                                           pass
                               """)
    result = _run("import lox; lox.loggers.from_config('memory,old')", tmp_path)
    why = ("lox backend OldBackend defines `write_batch`, which lox no longer uses: implement `write(self, run, "
           "table)` (the same arguments). See plugins.md.")
    assert f"RuntimeWarning: lox: the plugin 'lox_old' of package lox-old failed to load and is skipped: " \
           f"TypeError('{why}')" in result.stderr
    assert "BackendNotFound: unknown lox backend 'old' in 'old'." in result.stderr
    assert result.stderr.rstrip().endswith(f"Skipped, as they failed to load: the plugin 'lox_old' of package "
                                           f"lox-old (TypeError('{why}')).")


def test_a_backend_whose_plugin_failed_to_load_says_so_first(tmp_path):
    # The entry point named after the backend, as plugins.md declares it (`old = "old"`).
    _install_fake_distribution(tmp_path, "lox-old", "old", "old")
    (tmp_path / "old.py").write_text("from lox_backends.tracker import TrackerBackend\n")  # lox 0.2's module
    result = _run("import lox; lox.loggers.from_config('memory,old')", tmp_path)
    assert ("BackendNotFound: the lox backend 'old' in 'old' is offered by the plugin 'old' of package lox-old, "
            "which failed to load and was skipped: ModuleNotFoundError('lox_backends.tracker is no longer a module: "
            "since lox_backends was split into parts it is lox_backends.trackers.template") in result.stderr
    assert result.stderr.rstrip().endswith("Upgrade or reinstall lox-old, or tell its author.")


def test_a_registered_plugin_that_fails_can_be_registered_again_once_fixed():
    class Plugin:
        specs = ["console"]

        @hooks.hookimpl
        def lox_backends(self):
            return self.specs

    fresh, plugin = Registry(), Plugin()
    with pytest.raises(TypeError, match=r"'mine'.*returned 'console'"):
        fresh.register(plugin, name="mine")
    plugin.specs = [hooks.BackendSpec("mine", hooks.Backend)]
    fresh.register(plugin, name="mine")
    assert [o.package for o in fresh.offers()["mine"]] == ["<registered mine>"]
    with pytest.raises(TypeError, match=r"returned BackendSpec\(name='one'.*return a list of"):
        Registry().register(type("One", (), {"lox_backends": hooks.hookimpl(
            lambda self: hooks.BackendSpec("one", hooks.Backend))})(), name="one")


def test_a_backend_name_no_config_string_can_reach_is_refused():
    class Spaced:
        @hooks.hookimpl
        def lox_backends(self):
            return [hooks.BackendSpec("my backend", hooks.Backend)]

    with pytest.raises(ValueError, match=r"backend named 'my backend', which no config string can name"):
        Registry().register(Spaced(), name="spaced")


def test_a_hook_that_raises_is_skipped_and_the_other_plugins_work(tmp_path):
    _install_fake_distribution(tmp_path, "lox-raising", "lox_raising", "raising", "raise RuntimeError('no luck')")
    result = _run("import lox; lox.loggers.from_config('memory'); print('still works')", tmp_path)
    assert result.stdout.strip() == "still works", result.stderr
    assert "of package lox-raising failed to load and is skipped: RuntimeError('no luck')" in result.stderr


def test_a_plugin_that_looks_up_backends_while_imported_gets_a_clear_error(tmp_path):
    _install_fake_distribution(tmp_path, "lox-recursive", "lox_recursive", "recursive")
    (tmp_path / "lox_recursive.py").write_text("import lox\nlox.loggers.from_config('memory')\n")
    result = _run("import lox; lox.loggers.from_config('memory'); print('still works')", tmp_path)
    assert result.stdout.strip() == "still works", result.stderr
    assert "looked up lox's backends while it was being imported" in result.stderr


def test_missing_dotted_requirements_are_reported_not_crashed_on():
    spec = hooks.BackendSpec("gcs", hooks.Backend, requires=("lox_missing_parent.cloud.storage",))
    assert spec.missing() == ["lox_missing_parent.cloud.storage"]
    assert spec.install_hint() == "pip install lox_missing_parent.cloud.storage"


def test_a_folder_named_like_a_client_is_not_the_client(tmp_path, monkeypatch):
    # W&B's offline runs leave ./wandb in the working directory, which is on sys.path
    # for `python -m` and notebooks: as a namespace package it is not the client.
    (tmp_path / "lox_test_client").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = hooks.BackendSpec("needs-client", "lox_test_client:Backend", requires=("lox_test_client",),
                             install="pip install lox-test-client")
    assert spec.missing() == ["lox_test_client"]
    (tmp_path / "lox_test_client" / "__init__.py").write_text("")
    assert spec.missing() == []
