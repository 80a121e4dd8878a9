"""The README's and docs' examples run as written, and their links lead somewhere.

Every ```python block of README.md runs, and every block of docs/*.md whose fence says
```python runnable; each in a fresh interpreter in an empty directory, so an example cannot lean on
another's state or on files of the repository."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<code>.*?)^```", re.M | re.S)
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
README_LINES = 200


def runnable_blocks(page: Path, marker: str | None) -> list[str]:
    """The python blocks of ``page``: all of them, or only those whose fence also says ``marker``."""
    blocks = []
    for match in FENCE.finditer(page.read_text()):
        words = match["info"].split()
        if words[:1] == ["python"] and (marker is None or marker in words[1:]):
            blocks.append(match["code"])
    return blocks


EXAMPLES = [
    pytest.param(code, id=f"{page.name}-{i}")
    for page, marker in [(ROOT / "README.md", None), *((page, "runnable") for page in DOCS)]
    for i, code in enumerate(runnable_blocks(page, marker))
]


def test_the_readme_has_examples_and_fits_its_budget():
    assert len(runnable_blocks(ROOT / "README.md", None)) >= 3
    assert len((ROOT / "README.md").read_text().splitlines()) <= README_LINES


@pytest.mark.parametrize("code", EXAMPLES)
def test_an_example_runs_as_written(code, tmp_path):
    for module in ("transformers",):
        if (
            re.search(rf"^\s*(import|from) {module}\b", code, re.M)
            and importlib.util.find_spec(module) is None
        ):
            pytest.skip(f"the example needs {module}")
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {github_anchor(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


@pytest.mark.parametrize("page", [ROOT / "README.md", *DOCS], ids=lambda page: page.name)
def test_every_relative_link_leads_to_a_file_and_heading(page):
    broken = []
    for match in LINK.finditer(FENCE.sub("", page.read_text())):
        target = match["target"]
        if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked offline
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"
