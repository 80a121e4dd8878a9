"""Docstrings and comments say what the code does and why: its history and measurements live in the
docs (CHANGELOG.md, docs/performance_log.md, docs/benchmarks.md), so none of these come back into
``src/priorattn``: issue numbers, commit hashes, dates, GPU models, timings in micro- or milliseconds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "priorattn"
HISTORY = {
    "an issue number": re.compile(r"\bissues? \d+", re.I),
    # 7 to 40 hex digits with a digit and a letter among them, not the hex alphabet itself
    "a commit hash": re.compile(
        r"(?<![0-9A-Za-z_])(?!0123456789abcdef)(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9A-Za-z_])"
    ),
    "a date": re.compile(r"\b20\d\d-\d\d-\d\d\b"),
    "a GPU model": re.compile(r"\b(H100|H200|A100|A10G|L4|V100|RTX ?\d{4})\b"),
    "a timing": re.compile(r"\d(\.\d+)? ?(µs|us|ms)\b"),
}


def source_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def findings(text: str) -> list[str]:
    """``line: what it holds`` for each line of ``text`` that records history."""
    return [
        f"{number}: {kind}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), 1)
        for kind, pattern in HISTORY.items()
        if pattern.search(line)
    ]


@pytest.mark.parametrize("path", source_files(), ids=lambda path: str(path.relative_to(PACKAGE)))
def test_the_source_records_no_history(path):
    found = findings(path.read_text())
    assert not found, "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "    # fixed in issue 28",
        "Up to commit a7edaba a config named",
        "(measured 2026-11-27)",
        "26-62x flash SDPA on an H200",
        "334 us under bf16 autocast",
        "the step took 12.5 ms",
    ],
)
def test_each_kind_of_history_is_caught(line):
    assert findings(line)


@pytest.mark.parametrize(
    "line",
    [
        "return 0x7fffffff",
        'digits = "0123456789abcdef"',
        "colour = '#E41A1C'",
        "decade = 'acceded'",
        "seq_len=4096 tokens",
        "cuda:0",
    ],
)
def test_code_that_only_looks_like_history_passes(line):
    assert not findings(line)
