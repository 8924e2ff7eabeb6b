"""The documentation runs, and shows what it prints.

The rules, for every Markdown page under docs/ (the site of mkdocs.yml):

* Every ```python block runs, in page order, in one namespace per page, in a
  temporary working directory. What it prints must equal the ```text block that
  immediately follows it (nothing but blank lines in between), compared line by
  line after stripping trailing whitespace. A ```python block that no ```text
  block follows must print nothing.
* In a ```text block, a line that is exactly ``...`` matches any number of lines,
  none included. It is for output that depends on timing (the console backend's
  throttled lines); keep it rare.
* Blocks in other languages (bash, console, toml, pycon...) never run. A ```python
  block whose previous non-blank line is ``<!-- docs-test: skip -->`` does not
  run either (for code that needs a service or a tracker).
* ``<!-- docs-test: LOX_DEFAULT=off -->`` anywhere on a page runs it, and the
  examples it shows, with lox's default console output off; pages run with the
  default, ``console``, otherwise.
* A ```python block that holds only ``--8<-- "examples/NAME.py"`` (a
  pymdownx.snippets include) shows an example script: the script runs as a
  subprocess in a temporary directory, and its stdout must equal the ```text block
  after it. Every script in examples/ must be shown so on some page.
* Snippets included from outside docs/ otherwise (``--8<-- "plugins.md"`` on the
  plugin page) are not expanded here: tests/lox_backends/plugin/test_example_plugin.py checks
  plugins.md against the example plugin, and the last test below runs its main
  example.

Docstring examples run through pytest's --doctest-modules (see pyproject.toml).
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import itertools
import json
import os
import pathlib
import re
import subprocess
import sys

import jax
import pytest

import lox
from lox_backends.logger.logger import Logger

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
EXAMPLES = ROOT / "examples"
PAGES = sorted(DOCS.rglob("*.md"))
SCRIPTS = sorted(EXAMPLES.glob("*.py"))

SKIP = "<!-- docs-test: skip -->"
DEFAULT_OFF = "<!-- docs-test: LOX_DEFAULT=off -->"
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")
INCLUDE = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')


@dataclasses.dataclass
class Block:
    lang: str
    code: str
    line: int  # the page's line number of the block's first line of code
    skip: bool  # marked <!-- docs-test: skip -->
    expected: str | None = None  # the ```text block that follows it


def blocks(text: str) -> list[Block]:
    """The fenced blocks of a Markdown page, each with the ```text block after it."""
    lines = text.splitlines()
    found: list[tuple[Block, int, int]] = []  # (block, first line index, last line index)
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        indent, fence = m.group("indent"), m.group("fence")
        end = i + 1
        while end < len(lines) and not re.fullmatch(rf"[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*", lines[end]):
            end += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]]
        before = next((line.strip() for line in reversed(lines[:i]) if line.strip()), "")
        lang = (m.group("info").split() or [""])[0]
        found.append((Block(lang, "\n".join(body) + "\n", i + 2, before == SKIP), i, end))
        i = end + 1
    for (block, _, end), (after, start, _) in itertools.pairwise(found):
        if after.lang == "text" and not any(line.strip() for line in lines[end + 1 : start]):
            block.expected = after.code
    return [block for block, _, _ in found]


def included_script(block: Block) -> pathlib.Path | None:
    """The examples/ script a ```python block shows through a snippet include, if it does."""
    code = [line for line in block.code.splitlines() if line.strip()]
    includes = [INCLUDE.match(line.strip()) for line in code]
    if not any(includes):
        return None
    assert len(code) == 1, f"line {block.line}: a block that includes a snippet must hold only the include"
    path = ROOT / includes[0].group("path")
    assert path.parent == EXAMPLES, f"line {block.line}: only examples/ scripts are included in python blocks"
    return path


def lox_default(text: str) -> str:
    return "off" if DEFAULT_OFF in text else "console"


def same_output(expected: str, actual: str) -> bool:
    """`actual` matches `expected` line by line; an expected ``...`` line matches any lines."""
    want = [line.rstrip() for line in expected.rstrip().splitlines()]
    got = [line.rstrip() for line in actual.rstrip().splitlines()]
    parts = [[]]
    for line in want:
        if line == "...":
            parts.append([])
        else:
            parts[-1].append(line)
    if len(parts) == 1:
        return got == want
    first, *middle, last = parts
    if got[: len(first)] != first or len(got) < len(first) + len(last) or got[len(got) - len(last) :] != last:
        return False
    rest = got[len(first) : len(got) - len(last)]
    for part in middle:  # each in order, as early as possible
        at = next((k for k in range(len(rest) - len(part) + 1) if rest[k : k + len(part)] == part), None)
        if at is None:
            return False
        rest = rest[at + len(part) :]
    return True


def check_output(where: str, expected: str | None, actual: str) -> None:
    if expected is None:
        assert not actual.strip(), f"{where} prints, but no ```text block follows it:\n{actual}"
        return
    if not same_output(expected, actual):
        diff = "\n".join(difflib.unified_diff(expected.rstrip().splitlines(), actual.rstrip().splitlines(),
                                              "shown in the docs", "printed", lineterm=""))
        pytest.fail(f"{where} prints something else than the docs show:\n{diff}", pytrace=False)


# --- (a) every page ----------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_page_runs_and_prints_what_it_shows(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = page.read_text(encoding="utf-8")
    runnable = [b for b in blocks(text) if b.lang == "python" and not b.skip and included_script(b) is None]
    if not runnable:
        return
    namespace = {"__name__": "__docs__"}
    out = io.StringIO()  # one stream for the page, read after each block: loggers keep a reference
    lox.set_default(lox_default(text))
    try:
        with contextlib.redirect_stdout(out):
            for block in runnable:
                where = f"the python block at {page.relative_to(ROOT)}:{block.line}"
                try:
                    code = compile("\n" * (block.line - 1) + block.code, str(page), "exec")  # the page's line numbers
                    exec(code, namespace)  # noqa: S102
                    jax.effects_barrier()  # tapped events still on their way
                except Exception as error:
                    error.add_note(f"in {where}")
                    raise
                printed = out.getvalue()
                out.seek(0)
                out.truncate()
                check_output(where, block.expected, printed)
    finally:
        lox.set_default("console")
        for value in namespace.values():
            if isinstance(value, Logger):
                value.close()


# --- (b) every example script ------------------------------------------------------------------
def shown_scripts() -> dict[pathlib.Path, list[tuple[pathlib.Path, Block, str]]]:
    shown: dict = {}
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in blocks(text):
            script = included_script(block) if block.lang == "python" else None
            if script is not None:
                shown.setdefault(script, []).append((page, block, lox_default(text)))
    return shown


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_example_prints_what_its_page_shows(script, tmp_path):
    places = shown_scripts().get(script)
    include = f'--8<-- "examples/{script.name}"'
    assert places, f"examples/{script.name} is not shown on any docs page (a ```python block holding {include})"
    env = {k: v for k, v in os.environ.items() if k not in ("LOX_DEFAULT", "LOX_BACKENDS")}
    results = {}
    for page, block, default in places:
        where = f"examples/{script.name}, as shown at {page.relative_to(ROOT)}:{block.line}"
        assert block.expected is not None, f"{where}: no ```text block with its output follows it"
        if default not in results:
            command = [sys.executable, str(script)]
            results[default] = subprocess.run(command, cwd=tmp_path, env={**env, "LOX_DEFAULT": default},
                                              capture_output=True, text=True, timeout=300, check=False)
        result = results[default]
        assert result.returncode == 0, f"examples/{script.name} failed:\n{result.stderr}"
        check_output(where, block.expected, result.stdout)


def test_blocks_pair_code_with_the_output_after_it():
    page = f"""```python
print(1)
```

```text
1
```
```python
x = 1
```
prose
```text
not its output
```
{SKIP}

```python
skipped()
```
* a list
  ```python
  --8<-- "examples/nested.py"
  ```
"""
    found = blocks(page)
    assert [(b.lang, b.line, b.skip, b.expected) for b in found] == [
        ("python", 2, False, "1\n"), ("text", 6, False, None), ("python", 9, False, None),
        ("text", 13, False, None), ("python", 18, True, None), ("python", 22, False, None),
    ]
    assert included_script(found[-1]) == EXAMPLES / "nested.py" and included_script(found[0]) is None


def test_an_ellipsis_line_matches_any_lines():
    assert same_output("a\n...\nd\n", "a\nb\nc\nd\n") and same_output("a\n...\nd", "a\nd")
    assert same_output("...\nc\n...", "a\nb\nc\nd") and same_output("a  \nb", "a\nb  \n\n")
    assert not same_output("a\n...\nd", "a\nb") and not same_output("a\nb", "a\nb\nc")


# --- measured figures quoted outside the performance page -------------------------------------
def test_quoted_timings_are_those_of_the_performance_page():
    """The sharp bits quote benchmark figures: they must be the performance page's current ones."""
    performance = (DOCS / "performance.md").read_text(encoding="utf-8")
    for page in PAGES:
        if page.name != "performance.md":
            for figure in re.findall(r"\d[\d,.]*\s?(?:µs|ms)\b", page.read_text(encoding="utf-8")):
                where = page.relative_to(ROOT)
                assert figure in performance, f"{where} quotes {figure!r}, which docs/performance.md does not show"


# --- the plugin tutorial, included from plugins.md ---------------------------------------------
def test_plugin_page_includes_plugins_md():
    assert '--8<-- "plugins.md"' in (DOCS / "writing-a-plugin.md").read_text(encoding="utf-8")


def test_plugin_tutorial_example_writes_what_it_shows(tmp_path, monkeypatch):
    """plugins.md, step 4: the example runs and logs/ holds the events shown after it."""
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "plugins.md").read_text(encoding="utf-8")
    found = blocks(text)
    use = next(b for b in found if b.lang == "python" and 'from_config("console,jsonl:logs")' in b.code)
    shown = next(b for b in found if b.lang == "console" and b.code.startswith("$ cat logs/"))
    namespace = {"__name__": "__docs__"}
    with contextlib.redirect_stdout(io.StringIO()):  # the console backend's lines
        try:
            exec(compile("\n" * (use.line - 1) + use.code, "plugins.md", "exec"), namespace)  # noqa: S102
        finally:
            namespace["logger"].close()
    files = sorted(pathlib.Path("logs").glob("*.jsonl"))
    assert len(files) == 3  # three seeds, three runs
    run_line, *events = shown.code.splitlines()[1:]
    lines = files[0].read_text(encoding="utf-8").splitlines()
    run, shown_run = json.loads(lines[0]), json.loads(run_line)
    assert run.keys() == shown_run.keys() and run["metadata"] == shown_run["metadata"]
    assert lines[1:] == events
