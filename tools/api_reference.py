"""The API reference, written from the docstrings: ``make docs`` (or ``python tools/api_reference.py``).

One Markdown page per public namespace (``priorattn``, ``priorattn.priors``, ``priorattn.encodings``,
``priorattn.hf``, ``priorattn.models``, ``priorattn.scalar``, ``priorattn.eot``): every name of its
``__all__`` with its signature and docstring, a class's own public methods and properties too; and
``cli.md`` with every command's ``--help``. A constant's docstring is the ``#:`` comment block above
its assignment in the module that defines it. The pages go to ``--out`` (default ``docs/api``,
ignored by git), replacing what was there.

Exits 1, naming them, when a public name has no docstring (a dataclass's generated ``Name(field,
...)`` does not count), so a new public name cannot arrive undocumented; prints only the index's path
otherwise.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.util
import inspect
import re
import shutil
import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMESPACES = (
    "priorattn",
    "priorattn.priors",
    "priorattn.encodings",
    "priorattn.hf",
    "priorattn.models",
    "priorattn.scalar",
    "priorattn.eot",
)


def docstring(owner, name: str, value) -> str | None:
    """What documents ``value``, published as ``owner.name``: its own docstring, or a constant's ``#:``
    comment block."""
    if inspect.ismodule(value) or inspect.isclass(value) or inspect.isroutine(value):
        doc = inspect.getdoc(value)
        if inspect.isclass(value) and doc and doc.startswith(f"{value.__name__}("):  # a dataclass's own
            return None
        return doc
    return constant_comment(owner, name)


def constant_comment(owner, name: str) -> str | None:
    """The ``#:`` lines above ``name = ...`` in the module ``owner`` imports it from (or ``owner``)."""
    module = defining_module(owner, name)
    lines = inspect.getsource(module).splitlines()
    assignment = re.compile(rf"^{re.escape(name)}\s*(:[^=]*)?=")
    for i, line in enumerate(lines):
        if assignment.match(line):
            comment = []
            while i > 0 and lines[i - 1].startswith("#:"):
                i -= 1
                comment.insert(0, lines[i][2:].strip())
            return " ".join(comment) or None
    return None


def defining_module(owner, name: str):
    """The module whose ``from X import name`` brought ``name`` into ``owner``, followed to its end."""
    for node in ast.walk(ast.parse(inspect.getsource(owner))):
        if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
            package = owner.__name__ if hasattr(owner, "__path__") else owner.__package__
            source = importlib.import_module(
                importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            )
            return defining_module(source, name)
    return owner


def signature(value) -> str:
    try:
        return str(inspect.signature(value))
    except (TypeError, ValueError):  # builtins and some C types have none
        return ""


def members(cls) -> list[tuple[str, object]]:
    """A class's own public methods and properties, in the order they are defined."""
    return [
        (name, value)
        for name, value in vars(cls).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or isinstance(value, (property, staticmethod, classmethod)))
    ]


def entry(owner, name: str, value) -> tuple[str, bool]:
    """The Markdown of one public name, and whether it has a docstring."""
    doc = docstring(owner, name, value)
    if inspect.isclass(value):
        head, kind = f"class {name}{signature(value)}", "class"
    elif inspect.isroutine(value):
        head, kind = f"{name}{signature(value)}", "function"
    elif inspect.ismodule(value):
        head, kind = value.__name__, "module"
    else:
        shown = repr(value)
        head = f"{name} = {shown}" if len(shown) <= 80 else f"{name}: {type(value).__name__}"
        kind = "constant"
    parts = [f"## `{name}`", "", f"*{kind}*", "", "```python", head, "```", "", doc or "*(no docstring)*", ""]
    if inspect.isclass(value):
        for member, attribute in members(value):
            function = (
                attribute.fget
                if isinstance(attribute, property)
                else getattr(attribute, "__func__", attribute)
            )
            shown = member if isinstance(attribute, property) else f"{member}{signature(function)}"
            # its own docstring: getdoc would lend an override nn.Module's words ("Define the computation...")
            parts += [f"### `{name}.{shown}`", "", inspect.cleandoc(function.__doc__ or ""), ""]
    return "\n".join(parts), doc is not None


def namespace_page(module_name: str) -> tuple[str, list[str]]:
    """A namespace's page and its public names without a docstring."""
    module = importlib.import_module(module_name)
    parts = [f"# `{module_name}`", "", inspect.getdoc(module) or "", "", "[Index](index.md)", ""]
    undocumented = []
    for name in module.__all__:
        text, documented = entry(module, name, getattr(module, name))
        parts.append(text)
        if not documented:
            undocumented.append(f"{module_name}.{name}")
    return "\n".join(parts), undocumented


def command_helps(parser: argparse.ArgumentParser, words: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(command line, --help text)`` of ``parser`` and each of its subcommands, depth first."""
    found = [(" ".join(words), parser.format_help())]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += command_helps(sub, (*words, name))
    return found


def cli_page() -> str:
    from priorattn.cli import build_parser

    parts = ["# The command line: `python -m priorattn`", "", "[Index](index.md)", ""]
    for words, text in command_helps(build_parser(), ("priorattn",)):
        parts += [f"## `{words}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(parts)


def page_name(module_name: str) -> str:
    return module_name.replace(".", "_") + ".md"


def build(out: Path) -> list[str]:
    """Write the reference into ``out``; the public names without a docstring."""
    import priorattn

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a page built while something warns is not reproducible
        pages = {page_name(name): namespace_page(name) for name in NAMESPACES}
        pages["cli.md"] = (cli_page(), [])
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    index = [
        f"# priorattn {priorattn.__version__}: API reference",
        "",
        "Written from the docstrings by `make docs`.",
        "",
    ]
    index += [f"- [`{name}`]({page_name(name)})" for name in NAMESPACES]
    index += ["- [The command line](cli.md)", ""]
    (out / "index.md").write_text("\n".join(index))
    undocumented = []
    for file, (text, missing) in pages.items():
        (out / file).write_text(text)
        undocumented += missing
    return undocumented


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "api", help="(docs/api)")
    out = parser.parse_args(argv).out
    undocumented = build(out)
    if undocumented:
        print(f"public names without a docstring: {', '.join(undocumented)}", file=sys.stderr)
        return 1
    print(out / "index.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
