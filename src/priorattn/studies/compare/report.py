"""The ``compare`` report: one self-contained HTML page (figures embedded), its figures as PNG files,
and ``results.json`` with every number the page shows, keyed by model and evaluation."""

from __future__ import annotations

import html
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ...eval.pages import STYLE, image, number, papers_note, table
from ...eval.plots import TASK_TITLES, plot_accuracy_vs_length, plot_ppl, plot_retrieval_heatmaps
from ...eval.retrieval import RETRIEVES
from ...eval.verdicts import Estimate, Winner, compare_to, normal_interval, wilson_interval, winner
from ...figures import RunScale
from ...files import write_atomic, write_json_atomic
from ...provenance import environment
from ..retrieval.report import TASK_NAMES, best_of, study_html
from ..retrieval.report import summary_lines as retrieval_summary_lines
from ..styles import mechanism_style

# The paired delta (nats per byte) at the longest length is "flat" when its whole 95% interval lies
# at or below this: the extra context then costs at most ~2% perplexity, against the ~0.15 nats that
# passage difficulty alone moves a window's loss at this scale (docs/evaluation.md).
FLAT_TOLERANCE = 0.02


def retrieval_accuracy(results: list[dict], keep) -> Estimate | None:
    """Exact-match accuracy with its Wilson interval, pooled over the prompts of retrieval
    ``results`` at the lengths ``keep(length)`` accepts (every prompt one trial); ``None`` when there
    are none."""
    right = total = 0
    for r in results:
        for length, row in zip(r["lengths"], r["accuracy"]):
            if keep(length):
                right += sum(round(cell * r["trials"]) for cell in row)  # a cell is a share of trials
                total += len(row) * r["trials"]
    return wilson_interval(right, total) if total else None


def ppl_estimate(ppl: dict, i: int) -> Estimate:
    """Perplexity at length index ``i``: ``exp`` of the mean loss and of its normal interval over
    windows (unbounded for one window)."""
    loss, se = ppl["loss"][i], ppl["loss_se"][i]
    e = normal_interval(loss, se) if se is not None else Estimate(loss, -math.inf, math.inf)
    return Estimate(math.exp(e.value), math.exp(e.low), math.exp(e.high))


def delta_estimate(ppl: dict, i: int) -> Estimate:
    """The paired delta at length index ``i`` with its normal interval (unbounded for one window)."""
    delta, se = ppl["paired_delta"][i], ppl["paired_delta_se"][i]
    return normal_interval(delta, se) if se is not None else Estimate(delta, -math.inf, math.inf)


def summary(results: dict) -> dict[str, dict]:
    """Per model, the headline numbers, each measurement an :class:`Estimate` with its 95% interval:
    ppl at T (a number) and at the longest length, their ratio (a number: each length scores other
    text, so it is shown, never judged), the paired delta at the longest length, passkey accuracy at
    T, whether the model retrieves there (:func:`~priorattn.studies.compare.study.compare` then
    evaluated it past T), and for those (``None`` for the others) passkey accuracy past T and at the longest
    length and NIAH accuracy past T."""
    rows = {}
    for name, r in results.items():
        ppl, passkey, niah = r["ppl"], r["passkey"], r["niah"]

        def past_T(length: int, T: int = ppl["train_len"]) -> bool:
            return length > T

        rows[name] = dict(
            label=r["label"],
            val_loss=r["val_loss"],
            ppl_train_len=ppl["ppl"][0],
            ppl_longest=ppl_estimate(ppl, -1),
            ppl_ratio=ppl["ppl"][-1] / ppl["ppl"][0],
            paired_delta_longest=delta_estimate(ppl, -1),
            passkey_train_len=retrieval_accuracy([r["passkey_at_T"]], lambda length: True),
            retrieves_at_T=passkey is not None,  # compare evaluates past T only the models that do
            passkey_beyond=retrieval_accuracy([passkey], past_T) if passkey else None,
            passkey_longest=(
                retrieval_accuracy([passkey], lambda length, last=passkey["lengths"][-1]: length == last)
                if passkey
                else None
            ),
            niah_beyond=retrieval_accuracy(list(niah["variants"].values()), past_T) if niah else None,
        )
    return rows


WINNERS = (  # (metric, key in summary, best is the highest?, value that is no result at all)
    ("perplexity at the longest length", "ppl_longest", False, None),
    ("paired delta at the longest length", "paired_delta_longest", False, None),
    ("passkey accuracy past the training length", "passkey_beyond", True, 0.0),
    ("NIAH accuracy past the training length (all variants)", "niah_beyond", True, 0.0),
)


def winners(rows: dict[str, dict]) -> list[tuple[str, Winner, dict[str, Estimate]]]:
    """``(metric, Winner, {label: estimate})`` for each metric some model was measured on, among
    those models: a winner only when its 95% interval is separated from every other model's
    (:func:`~priorattn.eval.verdicts.winner`), else the tie; an accuracy every model scores 0 on is
    nobody's win."""
    found = []
    for metric, key, highest, nothing in WINNERS:
        estimates = {row["label"]: row[key] for row in rows.values() if row[key] is not None}
        if estimates:
            found.append((metric, winner(estimates, highest, nothing=nothing), estimates))
    return found


def context_effect(delta: Estimate) -> str:
    """What the extra context past T does, from the paired delta's 95% interval: ``"flat"`` when the
    whole interval is at most :data:`FLAT_TOLERANCE` (it costs at most that, or helps),
    ``"degrades"`` when the interval is above 0 and reaches past the tolerance, ``"within noise"``
    when it holds both 0 and values past the tolerance."""
    if delta.high <= FLAT_TOLERANCE:
        return "flat"
    return "degrades" if compare_to(delta, 0.0) == "above" else "within noise"


WITHIN_NOISE = "within noise: the 95% interval allows either answer"
NO_RETRIEVAL = "cannot be judged here: the model does not retrieve even at the training length at this budget"


@dataclass
class Claim:
    """A claim of the seeds, what was measured, and whether it agrees (``None``: undecided, and
    ``reason`` says why)."""

    claim: str
    measured: str
    agrees: bool | None
    reason: str = ""


def seed_claims(rows: dict[str, dict], longest: int, retrieval_longest: int) -> list[Claim]:
    """A :class:`Claim` for each claim of the seeds whose models were run.

    Perplexity claims are judged from the paired delta at the ``longest`` length
    (:func:`context_effect`). A claim about retrieval far away needs a model that retrieves at the
    training length first; it is then judged from the passkey accuracy at ``retrieval_longest``
    against :data:`RETRIEVES` (:func:`~priorattn.eval.verdicts.compare_to` with its Wilson
    interval). Either is ``None`` with its reason where the interval allows both answers.
    """
    claims = []

    def context(name: str, degrades_agrees: bool) -> tuple[str, bool | None, str]:
        row = rows[name]
        delta, effect = row["paired_delta_longest"], context_effect(row["paired_delta_longest"])
        said = dict(
            degrades=f"degrades by {delta.low:.3f} to {delta.high:.3f} nats per byte",
            flat=f"flat (the interval stays at or below +{FLAT_TOLERANCE})",
        ).get(effect, f"within noise (the interval holds 0 and values past +{FLAT_TOLERANCE})")
        measured = (
            f"{row['label']}: paired delta at {longest} tokens {delta.text(3, signed=True)} (95% "
            f"interval): {said}; ppl x{row['ppl_ratio']:.2f} from T (shown, not judged: each length "
            "scores other text)"
        )
        agrees = {"degrades": degrades_agrees, "flat": not degrades_agrees}.get(effect)
        return measured, agrees, WITHIN_NOISE if agrees is None else ""

    def far(name: str, retrieves_agrees: bool) -> tuple[str, bool | None, str]:
        row = rows[name]
        if not row["retrieves_at_T"]:
            measured = f"passkey accuracy {row['passkey_train_len'].text(2)} at the training length"
            return measured + " (longer lengths skipped)", None, NO_RETRIEVAL
        side = compare_to(row["passkey_longest"], RETRIEVES)
        measured = (
            f"passkey accuracy {row['passkey_longest'].text(2)} at {retrieval_longest} tokens, "
            f"{row['passkey_train_len'].value:.2f} at the training length (retrieves: >= {RETRIEVES})"
        )
        agrees = {"above": retrieves_agrees, "below": not retrieves_agrees}.get(side)
        return measured, agrees, WITHIN_NOISE if agrees is None else ""

    for name in ("rope", "sinusoidal"):
        if name in rows:
            claim = f"{rows[name]['label']} degrades past the training length (seed 003 App. D.2)"
            claims.append(Claim(claim, *context(name, degrades_agrees=True)))
    if "alibi" in rows:
        claims.append(
            Claim("ALiBi stays flat past the training length (seed 003 App. D.2)", *context("alibi", False))
        )
        claims.append(
            Claim("ALiBi retrieves poorly far away (seed 003 Fig. 2, Table 3)", *far("alibi", False))
        )
    for name, source in (("bam+ssmax", "seed 003 Fig. 2-3"), ("goat", "seed 000 Fig. 3")):
        if name in rows:
            claim = f"{rows[name]['label']} retrieves far beyond the training length ({source})"
            claims.append(Claim(claim, *far(name, retrieves_agrees=True)))
    return claims


def draw_figures(results: dict, out: Path, run: RunScale) -> dict[str, Path]:
    """Perplexity for every model; passkey and NIAH for the models evaluated past T (if any); each
    figure headed by the ``run``'s budget and steps, each model drawn in its mechanism's style."""
    styles = {r["label"]: mechanism_style(name) for name, r in results.items()}
    ppl = {r["label"]: r["ppl"] for r in results.values()}
    figures = dict(ppl=plot_ppl(ppl, out / "ppl.png", run=run, styles=styles))
    retrieving = {r["label"]: r for r in results.values() if r["passkey"] is not None}
    if not retrieving:
        return figures
    figures["passkey_heatmaps"] = plot_retrieval_heatmaps(
        {label: r["passkey"] for label, r in retrieving.items()},
        out / "passkey_heatmaps.png",
        title=TASK_TITLES["passkey"],
        run=run,
    )
    figures["passkey"] = plot_accuracy_vs_length(
        {label: r["passkey"] | dict(train_len=r["ppl"]["train_len"]) for label, r in retrieving.items()},
        out / "passkey_accuracy.png",
        title=TASK_TITLES["passkey"],
        run=run,
        styles=styles,
    )
    for variant in next(iter(retrieving.values()))["niah"]["variants"]:
        figures[f"niah_{variant}"] = plot_accuracy_vs_length(
            {
                label: r["niah"]["variants"][variant] | dict(train_len=r["ppl"]["train_len"])
                for label, r in retrieving.items()
            },
            out / f"niah_{variant}.png",
            title=TASK_TITLES[variant],
            run=run,
            styles=styles,
        )
    return figures


def estimate_cell(e: Estimate | None, digits: int = 3, signed: bool = False) -> str:
    return "—" if e is None else e.text(digits, signed)


def verdict(claim: Claim) -> str:
    if claim.agrees is None:
        return f'<span class="untested">{html.escape(claim.reason)}</span>'
    return '<span class="agree">agrees</span>' if claim.agrees else '<span class="differ">differs</span>'


def winner_text(found: Winner, estimates: dict[str, Estimate]) -> str:
    """``<b>GOAT</b> (value [low, high])``, ``tie: <b>A, B</b> (within noise; ...)`` or no model."""
    signed = any(e.low < 0 for e in estimates.values())  # a difference such as the paired delta
    if found.best is not None:
        return f"<b>{html.escape(found.best)}</b> ({estimates[found.best].text(signed=signed)})"
    if not found.tied:
        return "no model (every model scores 0)"
    values = "; ".join(f"{label} {estimates[label].text(signed=signed)}" for label in found.tied)
    return f"tie: <b>{html.escape(', '.join(found.tied))}</b> (within noise: {html.escape(values)})"


def plain(value):
    """An :class:`Estimate` as ``{"value", "low", "high"}`` (an infinite bound as ``None``); anything
    else as it is: what ``results.json`` holds."""
    if not isinstance(value, Estimate):
        return value
    return {key: v if math.isfinite(v) else None for key, v in asdict(value).items()}


def write_report(config, results: dict, out: Path, retrieval: dict | None = None) -> dict:
    """Write ``report.html``, ``results.json`` and the figures into ``out``; return the results.

    ``retrieval``: what :func:`~priorattn.studies.retrieval.run.run_retrieval_study` returned; its
    claims answer the seeds' retrieval claims, so the byte-level ones are listed only for models
    that retrieve at T."""
    figures = draw_figures(results, out, config.scale)
    rows = summary(results)
    any_model = next(iter(results.values()))
    T = any_model["ppl"]["train_len"]
    ppl_lengths = any_model["ppl"]["lengths"]
    retrieval_lengths = config.evaluations()["passkey"]["lengths"]
    found = winners(rows)
    claims = seed_claims(rows, ppl_lengths[-1], retrieval_lengths[-1])
    if retrieval is not None:
        claims = [claim for claim in claims if claim.reason != NO_RETRIEVAL]
    retrieving = {name: r for name, r in results.items() if r["passkey"] is not None}
    skipped = [rows[name] for name in results if name not in retrieving]
    created = time.strftime("%Y-%m-%d %H:%M")
    data = dict(
        created=created,
        config=asdict(config),
        scale=config.scale.record(),
        environment=environment(threads=torch.get_num_threads()),
        summary={name: {key: plain(v) for key, v in row.items()} for name, row in rows.items()},
        winners=[
            dict(
                metric=metric,
                winner=w.best,
                tied=w.tied,
                estimates={k: plain(e) for k, e in estimates.items()},
            )
            for metric, w, estimates in found
        ],
        seed_claims=[asdict(claim) for claim in claims],
        models=results,
    )
    if retrieval is not None:
        data["retrieval"] = dict(
            results=str(out / "retrieval" / "results.json"),
            **{key: retrieval[key] for key in ("smoke", "seed_claims", "ssmax", "winners")},
        )
    write_json_atomic(out / "results.json", data)

    corpus = (
        "the embedded Shakespeare corpus"
        if config.data is None
        else f"<code>{html.escape(config.data)}</code>"
    )
    title = "Positional mechanisms beyond the training length"
    parts = [f"<h1>priorattn: {title.lower()}</h1>"]
    if config.scale.smoke:
        parts.append(
            f"<p class='differ'>{html.escape(config.scale.title())} (the language models): run with "
            "the default budget for the study.</p>"
        )
    setup = (
        f"<p>Created {created} by <code>python -m priorattn compare</code>. Every model is the "
        f"<code>{config.preset}</code> preset trained for {config.steps} steps of {config.batch_size} x "
        f"{T} bytes of {corpus} ({config.retrieval_mix:.0%} of the sequences replaced by synthetic "
        f"passkey and needle samples), seed {config.seed}; only the positional mechanism differs. "
        "Models are then scored on the held-out validation split of that text beyond their training "
        f"length T = {T}: perplexity up to {ppl_lengths[-1]} tokens; passkey retrieval at T, and, for "
        f"the models that retrieve there, passkey and needle retrieval up to {retrieval_lengths[-1]} "
        "tokens. Intervals are 95%: normal over windows for perplexity and the paired delta, Wilson "
        "over prompts for accuracies.</p>"
    )
    parts.append(summary_html(found, retrieval, len(results)))
    parts.append(papers_note())
    if retrieval is not None:
        parts.append(study_html(retrieval, out / "retrieval", level=2))
        parts.append("<h2>Language modelling on text</h2>")
    parts.append(setup)
    parts.append("<h2>Winners</h2><ul>")
    for metric, w, estimates in found:
        parts.append(f"<li>{html.escape(metric)}: {winner_text(w, estimates)}</li>")
    parts.append(
        "</ul><p>A model wins a metric only when its 95% interval is separated from every other "
        "model's; otherwise the models not separated from the best are tied within noise.</p>"
    )
    parts.append("<h2>Against the seeds' claims</h2><ul>")
    if retrieval is not None:
        parts.append(
            "<li>The retrieval claims are judged by the synthetic study above; byte-level passkey "
            "claims are listed here only for models that retrieve at T.</li>"
        )
    for claim in claims:
        parts.append(
            f"<li>{html.escape(claim.claim)}: {verdict(claim)}. Measured: {html.escape(claim.measured)}.</li>"
        )
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
                "passkey @T",
                "passkey > T",
                f"passkey @{retrieval_lengths[-1]}",
                "NIAH > T",
            ],  # fmt: skip
            [
                [
                    html.escape(r["label"]),
                    number(r["val_loss"]),
                    number(r["ppl_train_len"], 2),
                    estimate_cell(r["ppl_longest"], 2),
                    number(r["ppl_ratio"], 2),
                    estimate_cell(r["paired_delta_longest"], signed=True),
                    estimate_cell(r["passkey_train_len"], 2),
                    estimate_cell(r["passkey_beyond"], 2),
                    estimate_cell(r["passkey_longest"], 2),
                    estimate_cell(r["niah_beyond"], 2),
                ]
                for r in rows.values()
            ],  # fmt: skip
            "Summary, with 95% intervals. Losses in nats per byte; paired delta at the longest length "
            "(negative: the long context helps); accuracies are exact-match shares over depths and "
            f"trials; — where not evaluated: passkeys beyond T and the NIAH run only for models that "
            f"retrieve at T (passkey accuracy at least {RETRIEVES}).",
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
            f"minus their loss in a window of T = {T} tokens (± standard error over windows; the "
            "verdicts use ± 1.96 standard errors).",
        )
    )
    parts.append("<h2>Passkey retrieval</h2>")
    if skipped:
        parts.append(
            f"<p>Skipped for {html.escape(', '.join(r['label'] for r in skipped))}: their passkey accuracy "
            f"at T is below {RETRIEVES}, and a model that does not retrieve at its training length cannot "
            "show whether retrieval survives beyond it, so the longer passkey lengths and the NIAH "
            "(minutes of evaluation per model) were not run.</p>"
        )
    if not retrieving:
        parts.append(
            f"<p>No language model here retrieves at T: in {config.steps} steps of byte-level training, "
            f"with {config.retrieval_mix:.0%} of the sequences passkey and needle samples, none learned "
            "to copy a passkey from its context, so the passkey columns above read 0 at T and dashes "
            "beyond. The seeds' models trained for billions of tokens; at this scale retrieval is "
            "judged by the synthetic study at the top of this page, whose small models are trained "
            "until they retrieve at T.</p>"
        )
    if retrieving:
        parts.append(image(figures["passkey"], "passkey accuracy against length"))
        parts.append(image(figures["passkey_heatmaps"], "passkey heatmaps"))
        parts.append(accuracy_table(retrieving, lambda r: r["passkey"], "Passkey accuracy per length."))
        parts.append("<h2>Needle in a haystack</h2>")
        for variant in next(iter(retrieving.values()))["niah"]["variants"]:
            parts.append(f"<h3>{html.escape(variant)}</h3>")
            parts.append(image(figures[f"niah_{variant}"], f"NIAH {variant}"))
            parts.append(
                accuracy_table(retrieving, lambda r, v=variant: r["niah"]["variants"][v], f"NIAH {variant}.")
            )
    parts.append(
        "<p>Every number on this page is in <code>results.json</code> beside it; each model's run "
        "directory holds its training log, checkpoint and per-evaluation results.</p>"
    )
    page = f"<!doctype html><html><head><meta charset='utf-8'><title>priorattn: {title}</title>"
    page += f"<style>{STYLE}</style></head><body>{''.join(parts)}</body></html>\n"
    write_atomic(out / "report.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return data


def summary_html(found: list, retrieval: dict | None, models: int) -> str:
    """The page's first section: the best mechanism of each retrieval task and language-model
    metric, where the sections below give the evidence."""
    items = []
    if retrieval is not None and not retrieval["winners"]:
        items.append("Retrieval (synthetic): no mechanism retrieves at T, so none is judged beyond it")
    if retrieval is not None:
        for w in retrieval["winners"]:
            task = html.escape(TASK_NAMES[w["task"]])
            items.append(
                f"Retrieval (synthetic, at its longest length), {task}: <b>{html.escape(best_of(w))}</b>"
            )
    for metric, w, estimates in found:
        items.append(f"Language models ({models}), {html.escape(metric)}: {winner_text(w, estimates)}")
    if not items:
        return ""
    body = "".join(f"<li>{item}</li>" for item in items)
    return f"<h2>Summary</h2><ul>{body}</ul>"


def summary_lines(data: dict) -> list[str]:
    """The page's summary as console lines, from what :func:`write_report` returned."""
    retrieval = data.get("retrieval")
    lines = [] if retrieval is None else retrieval_summary_lines(retrieval)
    for w in data["winners"]:
        lines.append(f"language models, {w['metric']}: {best_of(w)}")
    return lines


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
