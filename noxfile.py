"""Test lox on the newest JAX and the two minor releases before it.

    nox -s tests            # every JAX release below
    nox -s "tests(jax='0.10')"
    nox -s quickstart       # the README's main example
    nox -s lint             # ruff, pyright (0 errors) and the public API's type completeness
    nox -s benchmarks       # the ratios of benchmarks/, printed side by side
    nox -s docs             # the documentation site (mkdocs.yml), warnings as errors
"""

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "tests", "quickstart", "docs"]

# The newest JAX minor release first; each resolves to its newest patch release.
JAX_RELEASES = ["0.10", "0.9", "0.8"]


@nox.session
@nox.parametrize("jax", JAX_RELEASES)
def tests(session, jax):
    # The example third-party plugin of plugins.md is installed like any plugin; flax, equinox and
    # optax (the `frameworks` extra) resolve to releases that support each JAX release.
    session.install("-e", ".[test,all,frameworks]", "./tests/support/plugins/lox-jsonl",
                    f"jax~={jax}.0", f"jaxlib~={jax}.0")
    session.run("python", "-c", "import jax, flax, equinox, optax; print('JAX', jax.__version__, "
                "'flax', flax.__version__, 'equinox', equinox.__version__, 'optax', optax.__version__)")
    session.run("pytest", "-q", *session.posargs)


@nox.session
@nox.parametrize("jax", JAX_RELEASES)
def lint(session, jax):
    """ruff; pyright with no error on every JAX release (its types change); `lox`'s public API
    typed precisely enough that `pyright --verifytypes` scores at least 90 %."""
    # Not editable: pyright follows packages in site-packages, not setuptools' editable finder.
    session.install(".[all]", "ruff==0.17.6", "pyright==1.1.414", f"jax~={jax}.0", f"jaxlib~={jax}.0")
    session.run("ruff", "check", ".")
    session.run("pyright")
    session.run("python", "-c", VERIFY_TYPES)


# Fails when less than 90 % of the symbols `import lox` exports have known types.
VERIFY_TYPES = """
import json, subprocess, sys
command = ["pyright", "--verifytypes", "lox", "--ignoreexternal", "--outputjson"]
report = json.loads(subprocess.run(command, capture_output=True, text=True).stdout)["typeCompleteness"]
unknown = [s["name"] for s in report["symbols"] if s["isExported"] and not s["isTypeKnown"]]
print(f"lox's public API: {report['completenessScore']:.1%} of its symbols have known types; unknown: {unknown}")
sys.exit(0 if report["completenessScore"] >= 0.9 else 1)
"""


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
    """The documentation site into site/; tests/docs/test_docs.py runs its code (in `tests`)."""
    session.install("-e", ".[docs]")
    session.run("mkdocs", "build", "--strict", *session.posargs)
