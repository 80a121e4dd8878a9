"""``make docs``: the API reference builds from the docstrings and covers every public name."""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from pathlib import Path

import pytest

import priorattn
import priorattn.encodings
import priorattn.hf
import priorattn.priors
from priorattn.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("api_reference", ROOT / "tools" / "api_reference.py")
api_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(api_reference)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("api")
    assert api_reference.build(out) == []
    return out


@pytest.mark.parametrize("namespace", [priorattn, priorattn.priors, priorattn.encodings, priorattn.hf])
def test_every_public_name_appears_with_its_docstring(reference, namespace):
    page = (reference / api_reference.page_name(namespace.__name__)).read_text()
    sections = dict(re.findall(r"^## `([^`]+)`\n(.*?)(?=^## `|\Z)", page, re.M | re.S))
    assert sorted(sections) == sorted(namespace.__all__)
    for name, text in sections.items():
        assert "*(no docstring)*" not in text, name
    assert (
        "def attention" not in page
        and "attention(q: 'Tensor', k: 'Tensor', v: 'Tensor'" in (reference / "priorattn.md").read_text()
    )


def test_every_command_help_is_in_the_reference(reference):
    page = (reference / "cli.md").read_text()
    commands = [words for words, _ in api_reference.command_helps(build_parser(), ("priorattn",))]
    assert {"priorattn train", "priorattn compare", "priorattn eval ppl", "priorattn analyze priors"} <= set(
        commands
    )
    for words in commands:
        assert f"## `{words}`\n" in page
    assert "--prior PRIOR" in page


def test_the_index_links_every_page(reference):
    index = (reference / "index.md").read_text()
    assert f"priorattn {priorattn.__version__}" in index
    targets = re.findall(r"\]\(([^)]+)\)", index)
    assert len(targets) == len(api_reference.NAMESPACES) + 1
    assert all((reference / target).is_file() for target in targets)


def test_a_public_name_without_a_docstring_fails_the_build(tmp_path, monkeypatch, capsys):
    namespace = types.ModuleType("undocumented_namespace", "A namespace with one undocumented function.")

    def helper(x):
        return x

    namespace.helper = helper
    namespace.__all__ = ["helper"]
    monkeypatch.setitem(sys.modules, namespace.__name__, namespace)
    monkeypatch.setattr(api_reference, "NAMESPACES", (*api_reference.NAMESPACES, namespace.__name__))
    assert api_reference.main(["--out", str(tmp_path)]) == 1
    assert "undocumented_namespace.helper" in capsys.readouterr().err


def test_a_dataclass_generated_docstring_does_not_count():
    from dataclasses import dataclass

    @dataclass
    class Point:
        x: int

    assert api_reference.docstring(None, "Point", Point) is None
