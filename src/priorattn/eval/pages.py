"""What every HTML report of the studies is made of: tables, embedded figures, one style sheet."""

from __future__ import annotations

import base64
import html
from pathlib import Path


def table(header: list[str], rows: list[list], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    caption = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def number(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


#: The source papers the reports' "seed 00N" citations mean.
SOURCE_PAPERS = {
    "seed 000": "GOAT: Litman and Guo, <i>You Need Better Attention Priors</i>",
    "seed 003": "BAM: Bianchessi, Aguirre, Barros and Kupssinskü, <i>Bayesian Attention Mechanism: A "
    "Probabilistic Framework for Positional Encoding and Context Length Extrapolation</i>",
}


def papers_note() -> str:
    """A paragraph naming the papers behind the seed citations of a report."""
    cited = "; ".join(f"{seed} is {paper}" for seed, paper in SOURCE_PAPERS.items())
    return f"<p>The claims cite the source papers by number: {cited}.</p>"


def image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
td { white-space: nowrap; }
th:first-child, td:first-child { text-align: left; }
caption { caption-side: top; text-align: left; font-style: italic; padding-bottom: 0.3em; }
img { max-width: 100%; }
.agree { color: #1a7f37; } .differ { color: #b42318; font-weight: bold; } .untested { color: #9a6700; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""
