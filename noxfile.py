"""Test lox on the newest JAX and the two minor releases before it.

    nox -s tests            # every JAX release below
    nox -s "tests(jax='0.10')"
    nox -s quickstart       # the README's main example
    nox -s benchmarks       # the ratios of benchmarks/, printed side by side
    nox -s docs             # the documentation site (mkdocs.yml), warnings as errors
"""

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["tests", "quickstart", "docs"]

# The newest JAX minor release first; each resolves to its newest patch release.
JAX_RELEASES = ["0.10", "0.9", "0.8"]


@nox.session
@nox.parametrize("jax", JAX_RELEASES)
def tests(session, jax):
    # The example third-party plugin of plugins.md is installed like any plugin; flax, equinox and
    # optax (the `frameworks` extra) resolve to releases that support each JAX release.
    session.install("-e", ".[test,all,frameworks]", "./tests/plugins/lox-jsonl", f"jax~={jax}.0", f"jaxlib~={jax}.0")
    session.run("python", "-c", "import jax, flax, equinox, optax; print('JAX', jax.__version__, 'flax', flax.__version__, "
                "'equinox', equinox.__version__, 'optax', optax.__version__)")
    session.run("pytest", "-q", *session.posargs)


@nox.session
def quickstart(session):
    """The README's first command: the main job, in a fresh environment and folder."""
    session.install("-e", ".[plot]")
    session.run("python", "examples/quickstart.py")
    with session.chdir(session.create_tmp()):
        session.run("lox", "demo", "--epochs", "5")


@nox.session
def benchmarks(session):
    session.install("-e", ".[frameworks]")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session
def docs(session):
    """The documentation site into site/; tests/test_docs.py runs its code (in `tests`)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs)
