"""``priorattn retrieval --sweep``: the study at two model sizes and two training lengths, and which of
its verdicts hold across them.

The seeds' claims are about models far larger than the study's, trained at longer lengths. Whether a
verdict found at one size and one ``T`` is a finding about a mechanism or about that setting is what
the sweep shows: :data:`SIZES` (2 layers of width 64 and 4 of width 128, heads of 32 lanes) crossed
with :data:`TRAIN_LENGTHS` (``T`` = 64 and 256), each cell the study with those fields and every
other setting of the given config (mechanisms, seeds, tasks, budget), run into ``out/cells/<cell>/``
(:func:`sweep_cells`). Then every verdict is set beside its counterparts (:func:`across`): a seed
claim on a task, SSMax's effect per position and task, and the best mechanism per task. A verdict
**holds** where every cell judged it and all alike, **flips** where cells judged it differently, and
is **partly judged** where some cells could not judge it (a mechanism that does not retrieve at
``T`` there) and the others agree.
"""

from __future__ import annotations

import html
import time
from dataclasses import asdict, replace
from pathlib import Path

from ...eval.pages import STYLE, table
from ...files import prepare_out, write_atomic, write_json_atomic
from .report import TASK_NAMES, study_html
from .run import run_retrieval_study
from .study import RetrievalStudyConfig, label_of

SIZES = {"2x64": dict(n_layers=2, d_model=64, n_heads=2), "4x128": dict(n_layers=4, d_model=128, n_heads=4)}
TRAIN_LENGTHS = (64, 256)


def sweep_cells(config: RetrievalStudyConfig) -> dict[str, RetrievalStudyConfig]:
    """The study's configs of the sweep by cell name (``"2x64-T64"``: layers x width, ``T``): ``config``
    with the size's fields and ``train_len`` replaced."""
    return {
        f"{size}-T{train_len}": replace(config, train_len=train_len, **fields)
        for size, fields in SIZES.items()
        for train_len in TRAIN_LENGTHS
    }


def verdict_text(agrees: bool | None) -> str:
    return {True: "agrees", False: "differs", None: "not judged"}[agrees]


def status_of(values: list) -> str:
    """``"holds"``, ``"flips"``, ``"partly judged"`` or ``"not judged"`` for one verdict's value per
    cell, None where a cell could not judge it."""
    judged = {v for v in values if v is not None}
    if len(judged) > 1:
        return "flips"
    if not judged:
        return "not judged"
    return "holds" if None not in values else "partly judged"


def across(cells: dict[str, dict]) -> dict[str, list[dict]]:
    """Every verdict of the cells' results side by side: ``{"claims", "ssmax", "winners"}``, each a list
    of ``{"what", "task", "cells": {cell: verdict}, "status"}`` (:func:`status_of`). A claim's verdict
    in a cell is its ``agrees`` (True, False or None); SSMax's is the better of the pair's label, ``"tie"``,
    or None where the pair cannot be judged; the best mechanism's is its label or ``"tie: A, B"``."""
    found: dict[str, dict[tuple[str, str], dict]] = {"claims": {}, "ssmax": {}, "winners": {}}
    for cell, data in cells.items():
        for c in data["seed_claims"]:
            found["claims"].setdefault((c["claim"], c["task"]), {})[cell] = c["agrees"]
        for e in data["ssmax"]:
            verdict = None if e["judged"] else e["winner"] or "tie"
            found["ssmax"].setdefault((label_of(e["position"]), e["task"]), {})[cell] = verdict
        for w in data["winners"]:
            verdict = w["winner"] or "tie: " + ", ".join(w["tied"])
            found["winners"].setdefault(("best", w["task"]), {})[cell] = verdict
    return {
        kind: [
            dict(what=what, task=task, cells=by_cell, status=status_of([by_cell.get(c) for c in cells]))
            for (what, task), by_cell in rows.items()
        ]
        for kind, rows in found.items()
    }


def run_retrieval_sweep(
    config: RetrievalStudyConfig,
    out: str | Path,
    *,
    workers: int | None = None,
    progress: bool = True,
    log=print,
) -> dict:
    """Every cell of :func:`sweep_cells` run as the study into ``out/cells/<cell>`` (a re-run reuses
    what matches), then ``out/results.json`` (each cell's summary, claims and winners, and
    :func:`across`) and ``out/report.html``. Call it under ``if __name__ == "__main__":`` (the cells'
    models train in worker processes). Returns the results."""
    out = prepare_out(out)
    cells, seconds = {}, {}
    for name, cell in sweep_cells(config).items():
        log(f"sweep cell {name}")
        start = time.perf_counter()
        cells[name] = run_retrieval_study(
            cell, out / "cells" / name, workers=workers, progress=progress, log=log
        )
        seconds[name] = time.perf_counter() - start
    data = dict(
        created=time.strftime("%Y-%m-%d %H:%M"),
        config=asdict(config),
        sizes=SIZES,
        train_lengths=list(TRAIN_LENGTHS),
        seconds=seconds,
        across=across(cells),
        cells={
            name: {
                key: c[key]
                for key in ("config", "smoke", "scale", "summary", "seed_claims", "ssmax", "winners")
            }
            | dict(results=str(out / "cells" / name / "results.json"))
            for name, c in cells.items()
        },
    )
    write_json_atomic(out / "results.json", data)
    page = "<!doctype html><html><head><meta charset='utf-8'><title>priorattn retrieval sweep</title>"
    page += f"<style>{STYLE}</style></head><body>{sweep_html(data, cells, out)}</body></html>\n"
    write_atomic(out / "report.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return data


def sweep_html(data: dict, cells: dict[str, dict], out: Path) -> str:
    """The sweep as HTML: which verdicts hold and which flip, then each cell's study."""
    names = list(cells)
    parts = [
        "<h1>Retrieval across model sizes and training lengths</h1>",
        f"<p>The retrieval study in {len(names)} cells ({', '.join(names)}: layers x width, training "
        "length T), each with the same mechanisms, seeds, tasks and budget. A verdict <b>holds</b> where "
        "every cell judged it alike, <b>flips</b> where cells judged it differently, and is <b>partly "
        "judged</b> where some cells could not judge it (the mechanism does not retrieve at T there) "
        "and the others agree.</p>",
    ]
    kinds = (
        ("claims", "The seeds' claims", verdict_text),
        ("ssmax", "Prior or SSMax: the better of the pair", lambda v: "not judged" if v is None else v),
        ("winners", "Best at the longest length", lambda v: "not judged" if v is None else v),
    )
    for kind, title, text in kinds:
        rows = [
            [html.escape(r["what"]), html.escape(TASK_NAMES[r["task"]])]
            + [html.escape(text(r["cells"].get(name))) for name in names]
            + [f"<b>{r['status']}</b>"]
            for r in data["across"][kind]
        ]
        if rows:
            parts.append(f"<h2>{title}</h2>")
            parts.append(table(["verdict", "task", *names, "across the sweep"], rows, title))
    for name, cell in cells.items():
        parts.append(f"<h2>Cell {html.escape(name)}</h2>")
        parts.append(study_html(cell, out / "cells" / name, level=3))
    return "".join(parts)
