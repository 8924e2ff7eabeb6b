"""A griffe extension for the API reference: lox's docstrings as Markdown.

lox's docstrings hold doctest examples (``>>>`` lines and their output) in
their text, where Markdown would read them as nested block quotes and their
output as links. This wraps each example, up to the next blank line, in a
```` ```pycon ```` fence, and turns Sphinx roles (``:class:`lox.logdict` ``)
into code spans. The docstrings themselves stay as they are: pytest's
``--doctest-modules`` runs them.

Used by mkdocs.yml (``extensions: [docs/griffe_docstrings.py]``).
"""

from __future__ import annotations

import re

import griffe

SPHINX_ROLE = re.compile(r":(?:class|data|func|meth|attr|mod):`~?([^`]+)`")


def to_markdown(text: str) -> str:
    lines, out, i = SPHINX_ROLE.sub(r"`\1`", text).splitlines(), [], 0
    while i < len(lines):
        stripped = lines[i].lstrip()
        if not stripped.startswith(">>>"):
            out.append(lines[i])
            i += 1
            continue
        indent = lines[i][: len(lines[i]) - len(stripped)]
        end = i
        while end < len(lines) and lines[end].strip():
            end += 1
        out += ["", f"{indent}```pycon", *lines[i:end], f"{indent}```", ""]
        i = end
    return "\n".join(out)


class DocstringsAsMarkdown(griffe.Extension):
    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        todo = [pkg]
        while todo:
            obj = todo.pop()
            if obj.docstring is not None:
                obj.docstring.value = to_markdown(obj.docstring.value)
            todo += [member for member in obj.members.values() if not member.is_alias]
