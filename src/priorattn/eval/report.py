"""The ``compare`` report: one self-contained HTML page (figures embedded), its figures as PNG files,
and ``results.json`` with every number the page shows, keyed by model and evaluation."""

from __future__ import annotations

import base64
import html
import platform
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..files import write_atomic, write_json_atomic
from .plots import TASK_TITLES, plot_accuracy_vs_length, plot_ppl, plot_retrieval_heatmaps

# What the seeds claim, and the thresholds that decide whether a measurement agrees with them.
DEGRADES = 1.5  # perplexity at the longest length over perplexity at T above this: "degrades"
FLAT = 1.2  # ... below this: "stays flat"
RETRIEVES = 0.5  # passkey accuracy at the longest retrieval length at or above this: "retrieves"


def beyond(r: dict, key: str = "by_length") -> float | None:
    """Mean of ``r[key]`` over lengths past the training length."""
    values = [v for n, v in zip(r["lengths"], r[key]) if n > r["train_len"]]
    return sum(values) / len(values) if values else None


def niah_beyond(niah: dict) -> float | None:
    means = [beyond(r | dict(train_len=niah["train_len"])) for r in niah["variants"].values()]
    means = [m for m in means if m is not None]
    return sum(means) / len(means) if means else None


def summary(results: dict) -> dict[str, dict]:
    """Per model, the headline numbers: ppl at T and at the longest length, their ratio, the paired
    delta at the longest length, passkey and NIAH accuracy past T and at the longest length."""
    rows = {}
    for name, r in results.items():
        ppl, passkey = r["ppl"], r["passkey"]
        rows[name] = dict(
            label=r["label"],
            val_loss=r["val_loss"],
            ppl_train_len=ppl["ppl"][0],
            ppl_longest=ppl["ppl"][-1],
            ppl_ratio=ppl["ppl"][-1] / ppl["ppl"][0],
            paired_delta_longest=ppl["paired_delta"][-1],
            passkey_train_len=passkey["by_length"][0],
            passkey_beyond=beyond(passkey),
            passkey_longest=passkey["by_length"][-1],
            niah_beyond=niah_beyond(r["niah"]),
        )
    return rows


WINNERS = (  # (metric, key in summary, best is the highest?)
    ("perplexity at the longest length", "ppl_longest", False),
    ("paired delta at the longest length", "paired_delta_longest", False),
    ("passkey accuracy past the training length", "passkey_beyond", True),
    ("NIAH accuracy past the training length (all variants)", "niah_beyond", True),
)


def winners(rows: dict[str, dict]) -> list[tuple[str, list[str], float]]:
    """``(metric, labels of the best models, best value)``; ties share the win, and an accuracy of 0
    is won by nobody (an empty list)."""
    found = []
    for metric, key, highest in WINNERS:
        values = {name: row[key] for name, row in rows.items() if row[key] is not None}
        if not values:
            continue
        best = (max if highest else min)(values.values())
        tied = [rows[name]["label"] for name, v in values.items() if abs(v - best) <= 1e-9]
        if highest and best == 0:  # an accuracy nobody scored is nobody's win
            tied = []
        found.append((metric, tied, best))
    return found


def seed_claims(
    rows: dict[str, dict], longest: int, retrieval_longest: int
) -> list[tuple[str, str, bool | None]]:
    """``(claim, what was measured, agrees)`` for each claim of the seeds whose models were run.

    A claim about retrieval far away needs a model that retrieves at the training length (the
    shortest retrieval length) first; where it does not, ``agrees`` is ``None``: the run cannot
    judge the claim (more training, ``--budget``, is what it needs).
    """
    claims = []

    def far(name: str) -> str:
        row = rows[name]
        return (
            f"passkey accuracy {row['passkey_longest']:.2f} at {retrieval_longest} tokens, "
            f"{row['passkey_train_len']:.2f} at the training length"
        )

    def judged(name: str, agrees: bool) -> bool | None:
        return agrees if rows[name]["passkey_train_len"] >= RETRIEVES else None

    def ratio(name):
        return f"{rows[name]['label']}: ppl x{rows[name]['ppl_ratio']:.2f} from T to {longest}"

    for name in ("rope", "sinusoidal"):
        if name in rows:
            claims.append(
                (
                    f"{rows[name]['label']} degrades past the training length (seed 003 App. D.2)",
                    ratio(name) + f" (degrades: > x{DEGRADES})",
                    rows[name]["ppl_ratio"] > DEGRADES,
                )
            )
    if "alibi" in rows:
        row = rows["alibi"]
        claims.append(
            (
                "ALiBi stays flat past the training length (seed 003 App. D.2)",
                ratio("alibi") + f" (flat: < x{FLAT})",
                row["ppl_ratio"] < FLAT,
            )
        )
        claims.append(
            (
                "ALiBi retrieves poorly far away (seed 003 Fig. 2, Table 3)",
                far("alibi") + f" (poor: < {RETRIEVES})",
                judged("alibi", row["passkey_longest"] < RETRIEVES),
            )
        )
    for name, source in (("bam", "seed 003 Fig. 2-3"), ("goat", "seed 000 Fig. 3")):
        if name in rows:
            row = rows[name]
            claims.append(
                (
                    f"{row['label']} retrieves far beyond the training length ({source})",
                    far(name) + f" (retrieves: >= {RETRIEVES})",
                    judged(name, row["passkey_longest"] >= RETRIEVES),
                )
            )
    return claims


def draw_figures(results: dict, out: Path) -> dict[str, Path]:
    labelled = {r["label"]: r for r in results.values()}
    figures = dict(
        ppl=plot_ppl({label: r["ppl"] for label, r in labelled.items()}, out / "ppl.png"),
        passkey_heatmaps=plot_retrieval_heatmaps(
            {label: r["passkey"] for label, r in labelled.items()},
            out / "passkey_heatmaps.png",
            title=TASK_TITLES["passkey"],
        ),
        passkey=plot_accuracy_vs_length(
            {label: r["passkey"] | dict(train_len=r["ppl"]["train_len"]) for label, r in labelled.items()},
            out / "passkey_accuracy.png",
            title=TASK_TITLES["passkey"],
        ),
    )
    variants = next(iter(results.values()))["niah"]["variants"]
    for variant in variants:
        figures[f"niah_{variant}"] = plot_accuracy_vs_length(
            {
                label: r["niah"]["variants"][variant] | dict(train_len=r["ppl"]["train_len"])
                for label, r in labelled.items()
            },
            out / f"niah_{variant}.png",
            title=TASK_TITLES[variant],
        )
    return figures


def table(header: list[str], rows: list[list], caption: str = "") -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    caption = f"<caption>{html.escape(caption)}</caption>" if caption else ""
    return f"<table>{caption}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def number(value, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


VERDICTS = {
    True: '<span class="agree">agrees</span>',
    False: '<span class="differ">differs</span>',
    None: '<span class="untested">cannot be judged here: the model does not retrieve even at the '
    "training length at this budget</span>",
}

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1200px; margin: 2em auto; padding: 0 1em; color: #222; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
caption { caption-side: top; text-align: left; font-style: italic; padding-bottom: 0.3em; }
img { max-width: 100%; }
.agree { color: #1a7f37; } .differ { color: #b42318; font-weight: bold; } .untested { color: #9a6700; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def write_report(config, results: dict, out: Path) -> dict:
    """Write ``report.html``, ``results.json`` and the figures into ``out``; return the results."""
    figures = draw_figures(results, out)
    rows = summary(results)
    any_model = next(iter(results.values()))
    T = any_model["ppl"]["train_len"]
    ppl_lengths, retrieval_lengths = any_model["ppl"]["lengths"], any_model["passkey"]["lengths"]
    found = winners(rows)
    claims = seed_claims(rows, ppl_lengths[-1], retrieval_lengths[-1])
    created = time.strftime("%Y-%m-%d %H:%M")
    data = dict(
        created=created,
        config=asdict(config),
        environment=dict(
            torch=torch.__version__, python=platform.python_version(), threads=torch.get_num_threads()
        ),
        summary=rows,
        winners=[dict(metric=m, models=w, value=v) for m, w, v in found],
        seed_claims=[dict(claim=c, measured=m, agrees=a) for c, m, a in claims],
        models=results,
    )
    write_json_atomic(out / "results.json", data)

    parts = [f"<h1>priorattn compare: {len(results)} positional mechanisms</h1>"]
    parts.append(
        f"<p>Created {created} by <code>python -m priorattn compare</code>. Every model is the "
        f"<code>{config.preset}</code> preset trained for {config.steps} steps of {config.batch_size} x "
        f"{T} bytes of the embedded Shakespeare corpus ({config.retrieval_mix:.0%} of the sequences "
        f"replaced by synthetic passkey and needle samples), seed {config.seed}; only the positional "
        "mechanism differs. Models are then scored on the held-out plays beyond their training "
        f"length T = {T}: perplexity up to {ppl_lengths[-1]} tokens, passkey and needle retrieval up "
        f"to {retrieval_lengths[-1]} tokens.</p>"
    )
    parts.append("<h2>Winners</h2><ul>")
    for metric, labels, value in found:
        who = html.escape(", ".join(labels)) if labels else "no model"
        parts.append(f"<li>{html.escape(metric)}: <b>{who}</b> ({value:.3f})</li>")
    parts.append("</ul><h2>Against the seeds' claims</h2><ul>")
    for claim, measured, agrees in claims:
        parts.append(f"<li>{html.escape(claim)}: {VERDICTS[agrees]}. Measured: {html.escape(measured)}.</li>")
    parts.append("</ul>")
    parts.append(
        table(
            [
                "model",
                "val loss @T",
                "ppl @T",
                f"ppl @{ppl_lengths[-1]}",
                "ratio",
                "paired delta",
                "passkey > T",
                f"passkey @{retrieval_lengths[-1]}",
                "NIAH > T",
            ],  # fmt: skip
            [
                [
                    html.escape(r["label"]),
                    number(r["val_loss"]),
                    number(r["ppl_train_len"], 2),
                    number(r["ppl_longest"], 2),
                    number(r["ppl_ratio"], 2),
                    number(r["paired_delta_longest"]),
                    number(r["passkey_beyond"], 2),
                    number(r["passkey_longest"], 2),
                    number(r["niah_beyond"], 2),
                ]
                for r in rows.values()
            ],  # fmt: skip
            "Summary. Losses in nats per byte; paired delta at the longest length (negative: the long "
            "context helps); accuracies are means over depths and trials.",
        )
    )
    parts.append("<h2>Configurations</h2>")
    parts.append(
        table(
            ["model", "prior", "encoding", "window", "SSMax", "val loss", "unigram baseline", "run"],
            [
                [
                    html.escape(r["label"]),
                    *config_cells(config, name),
                    number(r["val_loss"]),
                    number(r["unigram_loss"]),
                    f"<code>{html.escape(r['run'])}</code>",
                ]
                for name, r in results.items()
            ],  # fmt: skip
        )
    )
    parts.append("<h2>Perplexity beyond the training length</h2>")
    parts.append(image(figures["ppl"], "perplexity against length"))
    parts.append(
        table(
            ["model", *map(str, ppl_lengths)],
            [[html.escape(r["label"]), *(number(p, 2) for p in r["ppl"]["ppl"])] for r in results.values()],
            "Perplexity per evaluation length (non-overlapping windows of held-out text).",
        )
    )
    parts.append(
        table(
            ["model", *map(str, ppl_lengths)],
            [
                [html.escape(r["label"])]
                + [delta_cell(d, se) for d, se in zip(r["ppl"]["paired_delta"], r["ppl"]["paired_delta_se"])]
                for r in results.values()
            ],
            f"Paired delta: loss of each window's last {T // 2} tokens with the window's whole context "
            f"minus their loss in a window of T = {T} tokens (± standard error over windows).",
        )
    )
    parts.append("<h2>Passkey retrieval</h2>")
    parts.append(image(figures["passkey"], "passkey accuracy against length"))
    parts.append(image(figures["passkey_heatmaps"], "passkey heatmaps"))
    parts.append(accuracy_table(results, lambda r: r["passkey"], "Passkey accuracy per length."))
    parts.append("<h2>Needle in a haystack</h2>")
    for variant in any_model["niah"]["variants"]:
        parts.append(f"<h3>{html.escape(variant)}</h3>")
        parts.append(image(figures[f"niah_{variant}"], f"NIAH {variant}"))
        parts.append(
            accuracy_table(results, lambda r, v=variant: r["niah"]["variants"][v], f"NIAH {variant}.")
        )
    parts.append(
        "<p>Every number on this page is in <code>results.json</code> beside it; each model's run "
        "directory holds its training log, checkpoint and per-evaluation results.</p>"
    )
    page = "<!doctype html><html><head><meta charset='utf-8'><title>priorattn compare</title>"
    page += f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n"
    write_atomic(out / "report.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return data


def config_cells(config, name: str) -> list[str]:
    model = config.model_config(name)
    return [model.prior, model.encoding, str(model.window or "—"), "yes" if model.ssmax else "no"]


def delta_cell(delta, se) -> str:
    if delta is None:
        return "—"
    return f"{delta:+.3f} ± {se:.3f}" if se is not None else f"{delta:+.3f}"


def accuracy_table(results: dict, pick, caption: str) -> str:
    lengths = sorted({n for r in results.values() for n in pick(r)["lengths"]})
    rows = []
    for r in results.values():
        by_length = dict(zip(pick(r)["lengths"], pick(r)["by_length"]))
        rows.append([html.escape(r["label"])] + [number(by_length.get(n), 2) for n in lengths])
    return table(["model", *map(str, lengths)], rows, caption + " Mean accuracy over depths and trials.")
