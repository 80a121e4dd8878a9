"""What the retrieval study shows: accuracies with intervals, the seeds' claims judged, figures, HTML.

Counts are pooled over depths, prompts and the seeds that retrieve at ``T`` per (mechanism, task,
length) (:func:`summarize`). The 95% interval holds the spread between seeds as well as between
sequences (:func:`~priorattn.eval.verdicts.seed_interval`: a bootstrap over seeds, then over each
seed's sequences, joined with Wilson's interval of the pooled count), so two seeds that disagree
widen it, and a winner is declared only where these intervals separate. Each seed's own accuracy is
kept beside it, with the number of seeds pooled and left out. A claim about a mechanism beyond ``T``
is judged per task, and only on a task where it retrieves at ``T`` (pooled accuracy at least
:data:`~priorattn.studies.retrieval.study.RETRIEVES_AT_T`); otherwise the report says so.
"""

from __future__ import annotations

import html
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from ...eval.pages import STYLE, image, table
from ...eval.verdicts import Estimate, compare_to, seed_interval, winner
from ...files import write_atomic, write_json_atomic
from ...provenance import environment
from .study import RETRIEVES_AT_T, SSMAX, RetrievalStudyConfig, label_of

KEEPS = 0.9  # "keeps near-perfect accuracy": the interval lies above this
COLLAPSES = 0.5  # "collapses" / "fades" / "struggles": the interval lies below this
TASK_NAMES = {
    "passkey": "passkey",
    "niah": "multi-key NIAH",
    "mqar": "MQAR",
    "text_passkey": "passkey in text",
    "latest": "latest value",
    "first": "first value",
    "offset": "offset recall",
    "span": "span copy",
}


#: How the study's intervals are made, as ``results.json`` states it.
INTERVAL = (
    "95%: the union of a two-stage bootstrap's percentiles (seeds with replacement, then each seed's "
    "sequences) and Wilson's interval of the count pooled over the seeds used"
)


def summarize(config: RetrievalStudyConfig, runs: dict[str, list[dict]]) -> dict[str, dict]:
    """Per mechanism: label, and per task ``lengths``, pooled ``correct`` / ``trials`` and
    ``accuracy`` per length with its seed-inclusive ``low`` / ``high`` (:data:`INTERVAL`), the
    ``heatmap`` ``[length][depth]``, ``at_train_len``, every seed's accuracies ``per_seed``
    ``[seed][length]``, and which seeds were pooled (``seeds_used``) or left out
    (``seeds_left_out``); per mechanism, ``seeds_at_criterion``, how many seeds' training stopped at
    the criterion (every check sequence right at ``T``) rather than at the step cap (with a fixed
    step count, how many answered every check sequence at the last check).

    The question beyond ``T`` is whether a model that retrieves at ``T`` still does, so a task's
    numbers pool the seeds that retrieve at ``T`` (accuracy at least :data:`RETRIEVES_AT_T`); a seed
    that does not is left out of them and named. When no seed does, all are pooled, and the task
    cannot be judged (``at_train_len`` below the threshold)."""
    summary = {}
    for mechanism, seeds in runs.items():
        tasks = {}
        for task in config.tasks:
            scored = [run["tasks"][task] for run in seeds]
            per_cell = scored[0]["prompts"]
            per_seed_length = per_cell * len(scored[0]["depths"])  # sequences per seed and length
            counts = np.asarray([s["correct"] for s in scored])  # (seeds, lengths, depths)
            per_seed = (counts.sum(2) / per_seed_length).tolist()
            used = [i for i, accuracy in enumerate(per_seed) if accuracy[0] >= RETRIEVES_AT_T]
            used = used or list(range(len(scored)))
            intervals = [seed_interval(c.tolist(), per_seed_length) for c in counts[used].sum(2).T]
            correct = counts[used].sum(0)  # (lengths, depths)
            tasks[task] = dict(
                lengths=scored[0]["lengths"],
                depths=scored[0]["depths"],
                correct=correct.sum(1).tolist(),
                trials=per_seed_length * len(used),
                accuracy=[e.value for e in intervals],
                low=[e.low for e in intervals],
                high=[e.high for e in intervals],
                per_seed=per_seed,
                seeds_used=[seeds[i]["seed"] for i in used],
                seeds_left_out=[run["seed"] for i, run in enumerate(seeds) if i not in used],
                heatmap=(correct / (per_cell * len(used))).tolist(),
                at_train_len=intervals[0].value,
            )
        summary[mechanism] = dict(
            label=label_of(mechanism),
            retrieves_at_train_len=all(t["at_train_len"] >= RETRIEVES_AT_T for t in tasks.values()),
            tasks=tasks,
            seeds_at_criterion=sum(bool(run["training"].get("retrieves")) for run in seeds),
            final_loss=[run["training"]["final_loss"] for run in seeds],
            train_seconds=[run["training"]["seconds"] for run in seeds],
            train_steps=[run["training"].get("steps") for run in seeds],
        )
    return summary


def longest(summary: dict, mechanism: str, task: str) -> Estimate:
    t = summary[mechanism]["tasks"][task]
    return Estimate(t["accuracy"][-1], t["low"][-1], t["high"][-1])


def reach(task_summary: dict) -> int | None:
    """The longest length up to which every length's interval lies above :data:`KEEPS`."""
    reached = None
    for n, low in zip(task_summary["lengths"], task_summary["low"]):
        if low < KEEPS:
            break
        reached = n
    return reached


def unjudged(summary: dict, mechanisms: list[str], tasks: list[str]) -> str | None:
    """Why a claim about ``mechanisms`` on ``tasks`` cannot be judged, or None when it can."""
    for mechanism in mechanisms:
        for task in tasks:
            at_t = summary[mechanism]["tasks"][task]["at_train_len"]
            if at_t < RETRIEVES_AT_T:
                return (
                    f"cannot be judged: {label_of(mechanism)} reaches "
                    f"only {at_t:.2f} on the {TASK_NAMES[task]} "
                    f"at the training length (needs {RETRIEVES_AT_T})"
                )
    return None


PASSKEY_TASKS = ("passkey", "text_passkey")  # a claim about passkey accuracy is judged on both

# (claim, source, position, expected: "keeps" | "collapses", tasks it is about (None: every task run))
CLAIMS = (
    (
        "BAM + SSMax keeps passkey accuracy far beyond T",
        "seed 003 Sec. 3.1, Fig. 2",
        "bam+ssmax",
        "keeps",
        PASSKEY_TASKS,
    ),
    ("BAM keeps passkey accuracy beyond T", "seed 003 Sec. 3.1, App. F.4", "bam", "keeps", PASSKEY_TASKS),
    ("GOAT keeps near-perfect retrieval far beyond T", "seed 000 Fig. 3", "goat", "keeps", None),
    ("RoPE collapses beyond T", "seed 000 Fig. 3; seed 003 Fig. 2", "rope", "collapses", None),
    ("RoPE with position interpolation collapses beyond T", "seed 000 Fig. 3", "rope_pi", "collapses", None),
    ("Sinusoidal collapses beyond T", "seed 000 Fig. 3; seed 003 Fig. 2", "sinusoidal", "collapses", None),
    ("NoPE degrades to near-random beyond T", "seed 003 Fig. 2", "nope", "collapses", PASSKEY_TASKS),
    (
        "Even ALiBi struggles at very long contexts",
        "seed 003 Sec. 3.1, Fig. 2",
        "alibi",
        "collapses",
        PASSKEY_TASKS,
    ),
)


def seed_claims(config: RetrievalStudyConfig, summary: dict) -> list[dict]:
    """Each seed claim whose mechanism was run, judged at the longest length on each task it is about
    that was run, one verdict per task: ``task``, ``agrees`` True / False, or None with the reason
    (``"within noise"``: the interval holds the threshold; or the mechanism does not retrieve at T on
    that task)."""
    longest_len = config.lengths()[-1]
    found = []
    for claim, source, mechanism, expected, about in CLAIMS:
        if mechanism not in summary:
            continue
        threshold = KEEPS if expected == "keeps" else COLLAPSES
        for task in (t for t in config.tasks if about is None or t in about):
            t = summary[mechanism]["tasks"][task]
            e = longest(summary, mechanism, task)
            measured = (
                f"{TASK_NAMES[task]} {e.value:.2f} [{e.low:.2f}, {e.high:.2f}] at {longest_len} tokens "
                f"({config.factors[-1]}x T), {t['at_train_len']:.2f} at T; seeds used "
                f"{len(t['seeds_used'])}, left out {len(t['seeds_left_out'])}"
            )
            reason = unjudged(summary, [mechanism], [task])
            agrees = None
            if reason is None:
                side = compare_to(e, threshold)
                if side == "within noise":
                    reason = f"within noise: the interval includes {threshold}"
                else:
                    agrees = side == ("above" if expected == "keeps" else "below")
            found.append(
                dict(claim=claim, source=source, task=task, measured=measured, agrees=agrees, reason=reason)
            )
    return found


def ssmax_effects(config: RetrievalStudyConfig, summary: dict) -> list[dict]:
    """For every position run with and without SSMax: which is better at the longest length, per
    task (``winner``: a label, or None when the intervals do not separate them; ``judged``: None, or
    why the pair cannot be judged), so a result can be told apart as the prior's or SSMax's (seed 003
    compares BAM with BAM SSMax)."""
    effects = []
    for mechanism in summary:
        with_ssmax = mechanism + SSMAX
        if mechanism.endswith(SSMAX) or with_ssmax not in summary:
            continue
        for task in config.tasks:
            pair = {m: longest(summary, m, task) for m in (mechanism, with_ssmax)}
            best = winner(pair, higher_is_better=True)
            effects.append(
                dict(
                    position=mechanism,
                    task=task,
                    without=asdict(pair[mechanism]),
                    with_ssmax=asdict(pair[with_ssmax]),
                    winner=None if best.best is None else label_of(best.best),
                    judged=unjudged(summary, [mechanism, with_ssmax], [task]),
                )
            )
    return effects


def winners(config: RetrievalStudyConfig, summary: dict) -> list[dict]:
    """Per task, the best mechanism at the longest length, or the tie of those not separated."""
    found = []
    for task in config.tasks:
        judged = {
            m: longest(summary, m, task)
            for m in summary
            if summary[m]["tasks"][task]["at_train_len"] >= RETRIEVES_AT_T
        }
        if not judged:
            continue
        best = winner(judged, higher_is_better=True)
        found.append(
            dict(
                task=task,
                winner=None if best.best is None else label_of(best.best),
                tied=[label_of(m) for m in best.tied],
            )
        )
    return found


def best_of(found: dict) -> str:
    """A task's or metric's winner from :func:`winners`, or the tie of those not separated."""
    return found["winner"] or "a tie within noise between " + ", ".join(found["tied"])


def summary_lines(data: dict) -> list[str]:
    """The study's best mechanism per task at its longest length (or the tie, or why none), as
    console lines, from what :func:`~priorattn.studies.retrieval.run.run_retrieval_study` returned."""
    if not data["winners"]:
        return ["retrieval (synthetic): no mechanism retrieves at T, so none is judged beyond it"]
    return [f"retrieval (synthetic), {TASK_NAMES[w['task']]}: {best_of(w)}" for w in data["winners"]]


def write_study(
    config: RetrievalStudyConfig, runs: dict, out: Path, *, workers: int, standalone: bool
) -> dict:
    """``results.json`` and the figures into ``out`` (and ``report.html`` when ``standalone``);
    returns the results, with ``figures`` naming the files."""
    from .figures import draw_study_figures

    summary = summarize(config, runs)
    data = dict(
        created=time.strftime("%Y-%m-%d %H:%M"),
        config=asdict(config),
        smoke=config.smoke,
        scale=config.scale.record(),
        environment=environment(workers=workers, threads_per_worker=1),
        interval=INTERVAL,
        summary=summary,
        seed_claims=seed_claims(config, summary),
        ssmax=ssmax_effects(config, summary),
        winners=winners(config, summary),
        runs=runs,
    )
    data["figures"] = {k: str(p) for k, p in draw_study_figures(config, data, out).items()}
    write_json_atomic(out / "results.json", data)
    if standalone:
        page = "<!doctype html><html><head><meta charset='utf-8'><title>priorattn retrieval</title>"
        page += f"<style>{STYLE}</style></head><body>{study_html(data, out, level=1)}</body></html>\n"
        write_atomic(out / "report.html", lambda tmp: tmp.write_text(page, encoding="utf-8"))
    return data


VERDICTS = {
    True: "<span class='agree'>agrees</span>",
    False: "<span class='differ'>differs</span>",
    None: "<span class='untested'>not judged</span>",
}


def study_html(data: dict, out: Path, level: int = 2) -> str:
    """The study as HTML: what was run, the claims judged, the tables and the figures (embedded)."""
    config = RetrievalStudyConfig(**data["config"])
    h = f"h{level}"
    sub = f"h{level + 1}"
    summary = data["summary"]
    lengths = config.lengths()
    shares = config.task_shares()
    tasks = ", ".join(
        TASK_NAMES[t] + ("" if shares is None else f" ({shares[i]:.0%} of the sequences)")
        for i, t in enumerate(config.tasks)
    )
    parts = [f"<{h}>Retrieval beyond the training length (synthetic tasks)</{h}>"]
    if data["smoke"]:
        parts.append(
            f"<p class='differ'>{html.escape(config.scale.title())}: run with the default budget for "
            "the study.</p>"
        )
    shift = " with a token shift" if config.token_shift else ""
    loss = "answers only in the loss" + (
        ", every token of the text" if "text_passkey" in config.tasks else ""
    )
    parts.append(
        f"<p>{len(summary)} mechanisms x {len(config.seeds)} seeds, each a {config.n_layers}-layer model of "
        f"width {config.d_model} ({config.n_heads} heads){shift}, trained on {config.batch_size} sequences "
        f"a step of {tasks} ({loss}) at lengths up to T = {config.train_len} "
        + (
            f"until it answered every check sequence at T exactly (at most {config.steps} steps)"
            if config.stop_at_criterion
            else f"for a fixed {config.steps} steps (its checks at T logged, not a reason to stop)"
        )
        + ", then scored on the "
        f"same sequences at {lengths[0]} to {lengths[-1]} tokens ({config.depths} needle depths x "
        f"{config.prompts} sequences per seed). Exact match: every answer token is the model's argmax "
        "(teacher-forced, the same as greedy decoding). A task's numbers pool the seeds that retrieve "
        f"at T (accuracy >= {RETRIEVES_AT_T}); intervals hold the spread between seeds and between "
        "sequences (a bootstrap over seeds, then sequences, joined with Wilson's 95% interval of the "
        "pooled count), and each table row says how many seeds it pools. A claim is "
        f"judged only where the mechanism retrieves at T; 'keeps' means the interval lies above {KEEPS}, "
        f"'collapses' below {COLLAPSES}, and 'within noise' that it contains the threshold.</p>"
    )
    left_out = [
        f"{s['label']} seed {seed} on the {TASK_NAMES[task]} "
        f"({t['per_seed'][config.seeds.index(seed)][0]:.2f} at T)"
        for s in summary.values()
        for task, t in s["tasks"].items()
        for seed in t["seeds_left_out"]
    ]
    if left_out:
        parts.append(
            "<p>Left out of the pooled numbers, as they do not retrieve at T: "
            + html.escape("; ".join(left_out))
            + ".</p>"
        )
    parts.append(f"<{sub}>Against the seeds' claims</{sub}><ul>")
    for claim, verdicts in claims_by_text(data["seed_claims"]).items():
        judged = {c["agrees"] for c in verdicts} - {None}
        split = " <b>The tasks disagree.</b>" if len(judged) > 1 else ""
        items = "".join(
            f"<li>{html.escape(TASK_NAMES[c['task']])}: {VERDICTS[c['agrees']]}"
            + (f" ({html.escape(c['reason'])})" if c["reason"] else "")
            + f". Measured: {html.escape(c['measured'])}.</li>"
            for c in verdicts
        )
        source = html.escape(verdicts[0]["source"])
        parts.append(f"<li>{html.escape(claim)} ({source}):{split}<ul>{items}</ul></li>")
    parts.append("</ul>")
    if data["ssmax"]:
        parts.append(f"<{sub}>Prior or SSMax?</{sub}><ul>")
        for e in data["ssmax"]:
            a, b = e["without"], e["with_ssmax"]
            verdict = e["judged"] or (f"{e['winner']} is better" if e["winner"] else "a tie within noise")
            parts.append(
                f"<li>{html.escape(label_of(e['position']))} on "
                f"the {TASK_NAMES[e['task']]} at {lengths[-1]} "
                f"tokens: without SSMax {a['value']:.2f} [{a['low']:.2f}, {a['high']:.2f}], with "
                f"{b['value']:.2f} [{b['low']:.2f}, {b['high']:.2f}]: {html.escape(verdict)}.</li>"
            )
        parts.append("</ul>")
    parts.append(f"<{sub}>Best at {lengths[-1]} tokens</{sub}><ul>")
    for w in data["winners"]:
        text = best_of(w)
        parts.append(f"<li>{TASK_NAMES[w['task']]}: <b>{html.escape(text)}</b></li>")
    parts.append("</ul>")
    figures = {k: Path(p) for k, p in data["figures"].items()}
    parts.append(image(figures["accuracy"], "exact match against length"))
    for task in config.tasks:
        rows = []
        for s in summary.values():
            t = s["tasks"][task]
            cells = [f"{a:.2f} [{lo:.2f}, {hi:.2f}]" for a, lo, hi in zip(t["accuracy"], t["low"], t["high"])]
            r = reach(t)
            seeds = f"{len(t['seeds_used'])} / {len(t['seeds_left_out'])}"
            rows.append([html.escape(s["label"]), seeds, *cells, "—" if r is None else str(r)])
        parts.append(
            table(
                ["mechanism", "seeds used / left out", *map(str, lengths), "holds >= 0.9 to"],
                rows,
                f"{TASK_NAMES[task]}: exact match per length, pooled over the seeds used and the "
                "depths, [95% over seeds and sequences]; the last column is the longest length up to "
                "which the whole interval stays above 0.9.",
            )
        )
        parts.append(image(figures[f"heatmap_{task}"], f"{task} heatmaps"))
    parts.append(f"<{sub}>What the priors learned</{sub}>")
    if "priors" in figures:
        parts.append(image(figures["priors"], "learned log-priors"))
    parts.append(learned_table(data))
    parts.append(
        f"<p>Every number here is in <code>{html.escape(str(out / 'results.json'))}</code>; each model's "
        "weights, training log and scores are in its directory under <code>models/</code>.</p>"
    )
    return "".join(parts)


def claims_by_text(claims: list[dict]) -> dict[str, list[dict]]:
    """The per-task verdicts of :func:`seed_claims` grouped by claim, in order."""
    grouped: dict[str, list[dict]] = {}
    for c in claims:
        grouped.setdefault(c["claim"], []).append(c)
    return grouped


def learned_table(data: dict) -> str:
    """Per mechanism with something learned, seed by seed: the parameters, layer by layer."""
    rows = []
    for mechanism, seeds in data["runs"].items():
        for run in seeds:
            for layer, found in enumerate(run["learned"]):
                for kind, values in found.items():
                    text = "; ".join(
                        f"{name} {fmt(v)}"
                        for name, v in values.items()
                        if name != "sink_positions" and v is not None
                    )
                    rows.append([html.escape(label_of(mechanism)), str(run["seed"]), str(layer), kind, text])
    if not rows:
        return ""
    return table(
        ["mechanism", "seed", "layer", "part", "per head"],
        rows,
        "Learned parameters per head: GGD's alpha (scale), beta (shape), mu (location) as seed 003 App. C "
        "defines them; GOAT's recency slope and its sink u(j) at j = 0, T, 4T, 64T (rows: heads); SSMax's s.",
    )


def fmt(values) -> str:
    """Learned values as a reader wants them, three significant digits each: ``"0.5, -1.2"`` for one
    per head, ``"h0: 0.5, 0.1; h1: ..."`` for a row per head (GOAT's sink at several positions)."""
    array = np.asarray(values, dtype=float)
    if array.ndim < 2:
        return ", ".join(f"{x:.3g}" for x in np.atleast_1d(array))
    rows = array.reshape(array.shape[0], -1)
    return "; ".join(f"h{head}: " + ", ".join(f"{x:.3g}" for x in row) for head, row in enumerate(rows))
