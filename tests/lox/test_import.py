"""`import lox` loads the core only (lox/__init__.py); the Logger layer, pyarrow and
the trackers load the first time `lox.loggers`, `lox.load`, `lox.wandb` or
`lox.neptune` is used. `python -m benchmarks imports` measures what it costs."""

import json
import subprocess
import sys

import pytest

# What `import lox` may load besides JAX and NumPy: the facade and the core that
# `lox.log`, `spool`, `tap` and `nolog` run on.
HEAVY = ("pyarrow", "pluggy", "rich", "matplotlib", "pandas", "polars", "mlflow", "wandb", "neptune", "tensorboard",
         "tensorboardX", "lox_backends", "lox.loggers", "lox.wandb", "lox.neptune")


def loaded_after(code: str) -> list[str]:
    """The modules a fresh interpreter holds after running `code`."""
    script = f"import json, sys\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    return json.loads(out.splitlines()[-1])


def heavy(modules: list[str]) -> list[str]:
    return [m for m in modules if m in HEAVY or m.startswith(tuple(h + "." for h in HEAVY))]


def test_import_lox_loads_the_core_and_nothing_of_the_backends():
    modules = loaded_after("import lox")
    ours = [m for m in modules if m.split(".")[0] in ("lox", "lox_core", "lox_backends")]
    assert heavy(modules) == [], f"`import lox` loaded {heavy(modules)}; it loads: {ours}"
    assert {"lox", "lox_core.primitive", "lox_core.spool", "lox_core.tap", "lox_core.nolog"} <= set(ours)


def test_logging_and_spooling_need_no_backend():
    code = ("import jax.numpy as jnp, lox\n"
            "out, logs = lox.spool(lambda x: (lox.log({'x': x}, step=0), x)[1])(jnp.ones(3))\n"
            "assert logs['x'].tolist() == [[1.0, 1.0, 1.0]], logs")
    modules = loaded_after(code)
    assert [m for m in heavy(modules) if m.startswith(("lox_backends", "lox.", "pluggy", "rich"))] == []


@pytest.mark.parametrize("name, loads", [("loggers", "lox_backends.logger.logger"),
                                         ("load", "lox_backends.runstore.reader"),
                                         ("runs", "lox_backends.runstore.table"),
                                         ("wandb", "lox_backends.tools.aliases"),
                                         ("neptune", "lox_backends.tools.aliases")])
def test_the_rest_loads_on_first_use(name, loads):
    modules = loaded_after(f"import lox\nlox.{name}")
    assert loads in modules


def test_the_lazy_names_are_the_modules_and_functions_users_know():
    import lox
    import lox.loggers
    from lox_backends.runstore.reader import load
    from lox_backends.runstore.table import run_table

    assert lox.loggers.from_config is not None and lox.load is load and lox.runs is run_table
    assert {"loggers", "load", "runs", "wandb", "neptune", "log", "spool"} <= set(dir(lox))
    assert not {"importlib", "TYPE_CHECKING", "Any"} & set(dir(lox))  # what lox/__init__.py imports for itself
    with pytest.raises(AttributeError, match="module 'lox' has no attribute 'lod'"):
        lox.lod  # noqa: B018
