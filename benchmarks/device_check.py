"""The library on one CUDA GPU in at most 8 minutes: its CUDA tests, attention, and training.

    PYTHONPATH=src python benchmarks/device_check.py                 # or: make device-check
    PYTHONPATH=src python benchmarks/device_check.py --out DIR --parts attention training

Three parts in this order, each within its share of ``--budget`` seconds (470 by default, a share
a part leaves unused goes to the next); a part whose time is spent skips its remaining cells with a
note, and a cell that fails records its error while the check goes on:

1. ``attention``: forward + backward time and peak memory of every prior on ``auto`` and on the
   explicit GPU routes that run it (``--routes``, default ``triton``, ``flex`` and ``sdpa``), against
   plain ``scaled_dot_product_attention`` on its flash backend and plain FlexAttention (both causal,
   no prior): causal, bfloat16, B 1, H 8, head width 64 (a folding prior's lanes come out of the
   64, as a layer takes them), L = 1024, 4096, 16384, 32768 (``--lengths``). Baselines and ``auto``
   first at every length, then the other routes.
2. ``training``: 100 optimizer steps of the ``tiny`` and ``small`` presets (``--presets``) per prior
   (batch 16 of random tokens, two packed documents per row, bfloat16 autocast, AdamW, gradient
   clipping), eager first, then through ``torch.compile``, each compiled cell in a process of its
   own: tokens per second, the seconds of the three warm-up steps (the compilation), peak memory.
3. ``pytest``: the tests with CUDA parametrizations (``-k cuda``: the fused Triton route and every
   other route against the float64 reference on CUDA, FlexAttention's backward, the layer and the
   GPT under ``torch.compile``), in a subprocess whose log goes to ``device_check_pytest.log``, for
   what is left of the budget; skipped with a note where pytest or hypothesis is not installed.

``device_check.json`` and ``device_check.md`` (the tables) go to ``--out`` (default
``$OUT/device_check`` where ``OUT`` is set, else ``~/.cache/priorattn/device_check``), rewritten
after every cell, so a check stopped from outside keeps what it measured. Without a CUDA GPU the
script says so in one line, runs every part at tiny sizes on the CPU (a dry run of its own code:
nothing is measured) and exits 0.

Packages the library imports at module level that no part calls (tqdm, tokenizers, safetensors,
matplotlib, entmax; a bare GPU image may lack them) are stood in for while the library's modules
import them; the JSON lists them under ``stand_ins``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import importlib.abc
import importlib.machinery
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import torch._dynamo

ROOT = Path(__file__).resolve().parent.parent
#: Packages priorattn imports at module level whose code no part of the check runs.
OPTIONAL = ("tqdm", "tokenizers", "safetensors", "matplotlib", "entmax")
PARTS = ("attention", "training", "pytest")
#: Each part's share of the budget.
SHARES = {"attention": 0.40, "training": 0.35, "pytest": 0.25}
#: Test files with CUDA parametrizations, the route comparisons first.
TEST_FILES = (
    "tests/functional/test_triton_route.py",
    "tests/functional/test_routes.py",
    "tests/test_compile.py",
    "tests/functional/test_flex.py",
    "tests/functional/test_masks_independent.py",
)
#: The explicit routes measured beside ``auto`` (``--routes``): by default the GPU's own, not
#: ``memeff``'s loop of small kernels (hundreds of times flash SDPA there).
ROUTES_MEASURED: list[str] = ["triton", "flex", "sdpa"]
#: The priors of :func:`priors` measured (``--priors``; empty: all).
PRIORS_MEASURED: list[str] = []
#: A (prior, route) whose cell took longer than this skips its longer lengths.
CELL_SECONDS = 20.0


@dataclass(frozen=True)
class Sizes:
    """What one run of the check measures: the GPU's sizes, or the dry run's."""

    lengths: tuple[int, ...]
    batch: int
    heads: int
    width: int
    reps: int
    presets: tuple[str, ...]
    train_batch: int
    train_seq_len: int | None  # None: the preset's
    steps: int
    warmup: int
    compile_backend: str


GPU = Sizes((1024, 4096, 16384, 32768), 1, 8, 64, 3, ("tiny", "small"), 16, None, 100, 3, "inductor")
DRY = Sizes((64,), 1, 2, 16, 1, ("tiny",), 1, 16, 1, 1, "eager")


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of the ``missing`` packages (and their submodules) made by priorattn's own modules get
    an empty module instead: its attributes are classes that raise ``ModuleNotFoundError`` when
    called (and can stand in an ``except`` clause). Imports from anywhere else fail as usual, so
    torch never mistakes a stand-in for the real package."""

    def __init__(self, missing: list[str]):
        self.missing = set(missing)

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] not in self.missing or not imported_by_priorattn():
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        return StandInModule(spec.name)

    def exec_module(self, module):
        pass


class StandInModule(types.ModuleType):
    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        what = f"{self.__name__}.{attr}"

        class Missing(Exception):
            def __init__(self, *args, **kwargs):
                raise ModuleNotFoundError(f"{what} is not installed (the device check stood in for it)")

        return Missing


def imported_by_priorattn() -> bool:
    """Whether the import in progress comes from a priorattn module (past importlib's frames)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith(("importlib", "_frozen_importlib")) and name != __name__:
            return name.partition(".")[0] == "priorattn"
        frame = frame.f_back
    return False


def installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a finder that refuses it, or a module set to None
        return False


def stand_in_for_missing() -> list[str]:
    """Install :class:`StandIns` for the :data:`OPTIONAL` packages that are not installed."""
    missing = [name for name in OPTIONAL if not installed(name)]
    if missing:
        sys.meta_path.insert(0, StandIns(missing))
    return missing


class Report:
    """The check's results, written to ``out`` as JSON and markdown after every change."""

    def __init__(self, out: Path, header: dict):
        self.out, self.data = out, dict(header, parts={})
        out.mkdir(parents=True, exist_ok=True)

    def part(self, name: str) -> dict:
        return self.data["parts"].setdefault(name, {"notes": []})

    def save(self) -> None:
        (self.out / "device_check.json").write_text(json.dumps(self.data, indent=2))
        (self.out / "device_check.md").write_text(markdown(self.data))


def error_text(e: BaseException) -> str:
    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return f"{type(e).__name__}: {first[:300]}"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(run, reps: int, device: torch.device) -> dict:
    """``run()`` once to warm up (compilation, caches), then ``reps`` timed calls: median ms, the
    warm-up's seconds, and (on CUDA) the peak memory a call allocates beyond what was held before."""
    start = time.perf_counter()
    run()
    synchronize(device)
    first_s = time.perf_counter() - start
    times, peak = [], None
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            held = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        run()
        synchronize(device)
        times.append(time.perf_counter() - start)
        if device.type == "cuda":
            peak = max(peak or 0.0, (torch.cuda.max_memory_allocated(device) - held) / 2**20)
    return dict(ms=1e3 * statistics.median(times), first_s=first_s, peak_mb=peak)


def failed(cell: dict, e: BaseException, device: torch.device) -> None:
    cell["error"] = error_text(e)
    if device.type == "cuda":
        torch.cuda.empty_cache()


# 1. pytest -----------------------------------------------------------------------------------------


def pytest_part(report: Report, deadline: float, dry: bool) -> None:
    part = report.part("pytest")
    missing = [name for name in ("pytest", "hypothesis") if not installed(name)]
    if missing:
        part["skipped"] = f"{' and '.join(missing)} not installed: the CUDA tests were not run"
        return
    args = ["-k", "cuda", "-m", "not slow", "-o", "addopts=", "-p", "no:cacheprovider"]
    args += ["--collect-only", "-q", "tests/test_compile.py"] if dry else ["-v", "--tb=short", *TEST_FILES]
    part["command"] = "pytest " + " ".join(args)
    log = report.out / "device_check_pytest.log"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    budget = max(1.0, deadline - time.time())
    start = time.time()
    with log.open("w") as stream:
        worker = subprocess.Popen(
            [sys.executable, __file__, "--run-pytest", *args], cwd=ROOT, env=env, stdout=stream, stderr=stream
        )
        try:
            part["exit_code"] = worker.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
            part["notes"].append(
                f"stopped when its {budget:.0f} s were spent: the counts are of the tests run"
            )
    part["seconds"] = round(time.time() - start, 1)
    text = log.read_text(errors="replace")
    outcomes = re.findall(r"^(\S+::\S+) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", text, re.MULTILINE)
    part["counts"] = {kind: sum(1 for _, o in outcomes if o == kind) for kind in {o for _, o in outcomes}}
    part["failed"] = [test for test, outcome in outcomes if outcome in ("FAILED", "ERROR")]
    summary = [
        line for line in text.splitlines() if re.match(r"^=+ .*(passed|failed|error|selected).* =+$", line)
    ]
    last = text.strip().splitlines()[-1:]
    part["summary"] = summary[-1].strip("= ") if summary else (last[0] if last else "")
    if dry:
        part["collected"] = len(re.findall(r"^tests/\S+::\S+", text, re.MULTILINE))


def run_pytest(args: list[str]) -> int:
    """The pytest worker: the library's optional imports stood in for, as in the check itself."""
    stand_in_for_missing()
    import pytest

    return int(pytest.main(args))


# 2. attention --------------------------------------------------------------------------------------


def priors(H: int) -> dict:
    """name -> (prior, ssmax) for H heads; None: plain attention through the library."""
    from priorattn import SSMax
    from priorattn.priors import GGD, GOAT, ALiBi, Sum, build_prior

    return {
        "NoPE": (None, None),
        "ALiBi": (ALiBi(H), None),
        "GGD": (GGD(H, init="alibi"), None),
        "GOAT": (GOAT(H, 4, init="alibi"), None),
        "GOAT (no slope)": (GOAT(H, 4, slope=False, init="alibi"), None),
        "ALiBi + GOAT": (Sum(ALiBi(H), GOAT(H, 2, slope=False)), None),
        "GOAT + SSMax": (GOAT(H, 4, init="alibi"), SSMax(H)),
        "T5": (build_prior("t5", H), None),
        "KERPLE (log)": (build_prior("kerple", H), None),
        "Sandwich": (build_prior("sandwich", H), None),
        "FIRE": (build_prior("fire", H), None),
        FOX: (None, None),
    }


#: FoX (Lin et al. 2025): no prior, the op's ``key_bias`` ``-F_j`` of forget gates (one fold lane).
FOX = "FoX (key bias)"


def fox_key_bias(B: int, H: int, L: int, device: torch.device) -> torch.Tensor:
    """``-F_j``, minus the cumulative sum of log forget gates, ``(B, H, L)`` float32, with gradient:
    gates of ``sigmoid(N(2, 1))``, about 0.13 nats forgotten per key, as a trained FoX layer's."""
    gen = torch.Generator(device=device).manual_seed(1)
    logits = torch.randn(B, H, L, device=device, generator=gen) + 2.0
    return (-torch.nn.functional.logsigmoid(logits).cumsum(-1)).requires_grad_()


def routes_of(prior, device: torch.device) -> list[str]:
    """The explicit routes that compute ``prior`` causal at default positions on ``device``."""
    from priorattn.functional.flex import flex_trains_on
    from priorattn.functional.masks import Masking
    from priorattn.functional.triton_route import triton_available, triton_takes

    pos = torch.arange(2, device=device)[None]
    causal = Masking(True, pos, pos, starts=(0, 0))
    routes = ["triton"] if triton_available(device) and triton_takes(prior, causal) else []
    routes += ["sdpa"] if prior is None or prior.can_fold(True) else []
    routes += ["memeff"] + (["flex"] if flex_trains_on(device) else [])
    return routes


def auto_route(q, k, prior, key_bias=None) -> str:
    """The route ``backend="auto"`` takes for these inputs at default positions."""
    from priorattn.functional import api
    from priorattn.functional.masks import Masking

    Lq, Lk = q.shape[2], k.shape[2]
    pos = torch.arange(Lk, device=q.device)[None]
    return api._choose(q, k, prior, Masking(True, pos[:, Lk - Lq :], pos, starts=(Lk - Lq, 0)), key_bias)


def attention_part(report: Report, deadline: float, sizes: Sizes, device: torch.device) -> None:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    import priorattn
    from priorattn.functional.flex import compiled_flex

    part = report.part("attention")
    B, H, D = sizes.batch, sizes.heads, sizes.width
    dtype = torch.bfloat16
    part["settings"] = dict(
        batch=B, heads=H, head_width=D, dtype="bfloat16", causal=True, lengths=sizes.lengths
    )
    part["cells"] = cells = []
    chosen = priors(H)

    def inputs(L: int, Dk: int):
        gen = torch.Generator(device=device).manual_seed(0)
        q, k = (torch.randn(B, H, L, Dk, device=device, dtype=dtype, generator=gen) for _ in range(2))
        v = torch.randn(B, H, L, D, device=device, dtype=dtype, generator=gen)
        return [t.requires_grad_() for t in (q, k, v)], torch.randn(B, H, L, D, device=device, dtype=dtype)

    def fwd_bwd(attend, L: int, Dk: int):
        (q, k, v), grad = inputs(L, Dk)

        def run():
            for t in (q, k, v):
                t.grad = None
            attend(q, k, v).backward(grad)

        return run

    def flash(q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    masks = {}

    def flex(q, k, v):
        L = q.shape[2]
        if L not in masks:
            masks[L] = create_block_mask(lambda b, h, i, j: i >= j, None, None, L, L, device=str(device))
        return compiled_flex()(q, k, v, block_mask=masks[L])

    # (name, route, attend, Dk) in the order they are measured: baselines and auto first.
    plans = []
    for name, (prior, ssmax) in chosen.items():
        if PRIORS_MEASURED and name not in PRIORS_MEASURED:
            continue
        prior = None if prior is None else prior.to(device)
        ssmax = None if ssmax is None else ssmax.to(device)
        Dk = D - prior.fold_width if prior is not None and prior.can_fold(True) else D
        explicit = [r for r in routes_of(prior, device) if r in ROUTES_MEASURED]
        for route in ["auto", *explicit]:

            def attend(q, k, v, prior=prior, ssmax=ssmax, route=route, fox=name == FOX):
                B, H, L, _ = q.shape
                key_bias = fox_key_bias(B, H, L, q.device) if fox else None
                return priorattn.attention(
                    q, k, v, prior=prior, ssmax=ssmax, key_bias=key_bias, backend=route
                )

            plans.append((name, route, attend, Dk, prior))
    first = [("SDPA (flash)", "plain", flash, D, None), ("FlexAttention", "plain", flex, D, None)]
    first += [plan for plan in plans if plan[1] == "auto"]
    rest = [plan for plan in plans if plan[1] != "auto"]
    too_slow = {}  # (name, route) -> why its longer lengths are skipped
    for group in (first, rest):
        for L in sizes.lengths:
            for name, route, attend, Dk, prior in group:
                cell = dict(prior=name, route=route, L=L)
                cells.append(cell)
                if route == "flex" or (route == "plain" and name == "FlexAttention"):
                    if device.type != "cuda":
                        cell["skipped"] = "FlexAttention has no backward on the CPU"
                        continue
                if time.time() > deadline:
                    cell["skipped"] = "the part's time was spent"
                    continue
                if (name, route) in too_slow:
                    cell["skipped"] = too_slow[name, route]
                    continue
                try:
                    if route == "auto":
                        (q, k, _), _ = inputs(L, Dk)
                        key_bias = fox_key_bias(B, H, L, device) if name == FOX else None
                        cell["auto_takes"] = auto_route(q, k, prior, key_bias)
                    start = time.time()
                    cell.update(measure(fwd_bwd(attend, L, Dk), sizes.reps, device))
                    if time.time() - start > CELL_SECONDS:
                        too_slow[name, route] = f"{time.time() - start:.0f} s at L = {L}"
                except Exception as e:  # one failing cell must not end the check
                    failed(cell, e, device)
                    too_slow[name, route] = f"failed at L = {L}"
                report.save()
                progress(cell, device)
    add_ratios(cells)


def add_ratios(cells: list[dict]) -> None:
    """Each cell's time and peak memory as multiples of plain flash SDPA's at its length."""
    flash = {c["L"]: c for c in cells if c["prior"] == "SDPA (flash)" and "ms" in c}
    for cell in cells:
        base = flash.get(cell["L"])
        if base is None or "ms" not in cell:
            continue
        cell["x_flash_time"] = cell["ms"] / base["ms"]
        if cell.get("peak_mb") is not None and base.get("peak_mb"):
            cell["x_flash_memory"] = cell["peak_mb"] / base["peak_mb"]


# 3. training ---------------------------------------------------------------------------------------

#: name -> GPTConfig overrides of the preset. NoPE first: it is the baseline.
TRAINED = {
    "NoPE": dict(prior="uniform", encoding="none"),
    "ALiBi": dict(prior="alibi"),
    "GGD": dict(prior="ggd"),
    "GOAT": dict(prior="goat"),
    "ALiBi + GOAT": dict(prior="alibi+goat"),
    "FoX": dict(prior="uniform", encoding="none", attention="fox"),
}


#: Route policies a training cell may run under (``--train-policies``): ``auto`` as it is, or
#: ``fused``, ``auto`` taking the fused Triton kernels at every length where it would take
#: FlexAttention (``api.TRITON_MIN_KEYS`` 0), so one run compares the two at training lengths.
TRAIN_POLICIES = {"auto": None, "fused": 0}
#: The policies measured.
POLICIES_MEASURED: list[str] = ["auto"]


def training_part(report: Report, deadline: float, sizes: Sizes, device: torch.device) -> None:
    part = report.part("training")
    part["settings"] = dict(
        batch=sizes.train_batch, steps=sizes.steps, warmup_steps=sizes.warmup, dtype="bfloat16 autocast"
    )
    part["cells"] = cells = []
    trained = TRAINED if device.type == "cuda" else {"GOAT": TRAINED["GOAT"]}
    for compiled in (False, True):
        for preset_name in sizes.presets:
            for name, overrides in trained.items():
                for policy in POLICIES_MEASURED if name != "NoPE" else ["auto"]:
                    cell = dict(preset=preset_name, prior=name, compiled=compiled, policy=policy)
                    cells.append(cell)
                    if time.time() > deadline:
                        cell["skipped"] = "the part's time was spent"
                        continue
                    try:
                        if compiled:
                            cell.update(train_cell_apart(preset_name, name, policy, sizes, deadline))
                        else:
                            with route_policy(policy):
                                cell.update(train_cell(preset_name, overrides, compiled, sizes, device))
                    except Exception as e:
                        failed(cell, e, device)
                    report.save()
                    progress(cell, device)


@contextlib.contextmanager
def route_policy(policy: str):
    """``auto``'s choice under ``policy`` (:data:`TRAIN_POLICIES`) while the block runs."""
    from priorattn.functional import api

    min_keys = api.TRITON_MIN_KEYS
    if TRAIN_POLICIES[policy] is not None:
        api.TRITON_MIN_KEYS = TRAIN_POLICIES[policy]
    try:
        yield
    finally:
        api.TRITON_MIN_KEYS = min_keys


def train_cell_apart(preset_name: str, name: str, policy: str, sizes: Sizes, deadline: float) -> dict:
    """A compiled cell in a process of its own: compiling after the eager cells in one process ended
    it with a segmentation fault on the H200 (torch 2.11), and a crash must cost one cell, not the
    check. The worker prints the cell's JSON on its last line."""
    # the worker takes the GPU's sizes wherever there is a GPU (the lengths and presets it is told)
    args = [sys.executable, __file__, "--run-train-cell", preset_name, name, policy]
    args.append("gpu" if torch.cuda.is_available() else "dry")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    try:
        done = subprocess.run(
            args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=max(1.0, deadline - time.time())
        )
    except subprocess.TimeoutExpired:
        return dict(skipped="the part's time was spent while it compiled")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return dict(error=f"worker exit code {done.returncode}: " + " | ".join(tail))
    return json.loads(lines[-1])


def run_train_cell(preset_name: str, name: str, policy: str, sizes_name: str) -> int:
    """The compiled-cell worker of :func:`train_cell_apart`."""
    stand_in_for_missing()
    sizes = GPU if sizes_name == "gpu" else DRY
    device = torch.device("cuda" if sizes is GPU else "cpu")
    set_recompile_limits()
    with route_policy(policy):
        print(json.dumps(train_cell(preset_name, TRAINED[name], True, sizes, device)))
    return 0


def train_cell(preset_name: str, overrides: dict, compiled: bool, sizes: Sizes, device: torch.device) -> dict:
    """``sizes.steps`` optimizer steps, as ``priorattn train`` takes them (``train_step``) with
    ``bf16`` and, when ``compiled``, ``compile``; without reading the loss back each step."""
    from priorattn.data import document_positions
    from priorattn.models import GPT, preset
    from priorattn.train import TrainConfig
    from priorattn.train.loop import summed_token_loss
    from priorattn.train.optim import build_optimizer

    torch.manual_seed(0)
    config = preset(preset_name, **overrides)
    L = sizes.train_seq_len or config.seq_len
    model = GPT(preset(preset_name, **overrides, seq_len=L)).to(device)
    optimizer = build_optimizer(model, TrainConfig(bf16=True))
    B = sizes.train_batch
    tokens = torch.randint(0, config.vocab_size, (B, L + 1))
    doc_ids = (torch.arange(L) >= torch.randint(1, L, (B, 1))).long()  # two documents per row
    positions = document_positions(doc_ids) if model.reads_absolute_positions else None  # on the host
    tokens, doc_ids = tokens.to(device), doc_ids.to(device)
    positions = None if positions is None else positions.to(device)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    if compiled:
        torch._dynamo.reset()  # each compiled cell compiles afresh: its warm-up time is its own
    loss_of = (
        torch.compile(summed_token_loss, backend=sizes.compile_backend) if compiled else summed_token_loss
    )

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = loss_of(model, inputs, positions, doc_ids, targets) / targets.numel()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(sizes.warmup):
        step()
    synchronize(device)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(sizes.steps):
        step()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return dict(
        seq_len=L,
        tokens_per_s=sizes.steps * B * L / seconds,
        ms_per_step=1e3 * seconds / sizes.steps,
        warmup_s=warmup_s,
        peak_mb=peak,
    )


# The report ----------------------------------------------------------------------------------------


def progress(cell: dict, device: torch.device) -> None:
    if device.type == "cuda":
        print(
            json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in cell.items()}), flush=True
        )


def number(value, digits: int) -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A markdown table: text columns left, the rest right-aligned."""
    align = ["---" if name in ("prior", "route", "preset", "compiled", "note") else "---:" for name in header]
    return [f"| {' | '.join(row)} |" for row in [header, align, *rows]] + [""]


def markdown(data: dict) -> str:
    """The report's tables."""
    lines = [f"# Device check: {data['device']}", ""]
    lines += [f"torch {data['torch']}, CUDA {data['cuda']}, {data['date']}: `{data['command']}`", ""]
    if data.get("dry_run"):
        lines += ["A dry run on the CPU: tiny sizes, nothing measured.", ""]
    if data.get("stand_ins"):
        lines += [f"Stood in for (not installed): {', '.join(data['stand_ins'])}.", ""]
    parts = data["parts"]
    for name, part in parts.items():
        if "error" in part:
            lines += [f"## {name}: failed", "", part["error"], ""]
    p = parts.get("pytest")
    if p and "error" not in p:
        lines += ["## CUDA tests", ""]
        lines += [p.get("skipped") or f"`{p['command']}`: {p['summary']} ({p['seconds']} s)", ""]
        lines += (
            [f"- failed: `{test}`" for test in p.get("failed", [])] + [f"- {n}" for n in p["notes"]] + [""]
        )
    p = parts.get("attention")
    if p and "settings" in p:
        s = p["settings"]
        lines += ["## Attention: forward + backward", ""]
        lines += [f"B {s['batch']}, H {s['heads']}, head width {s['head_width']}, bfloat16, causal.", ""]
        header = ["prior", "route", "L", "ms", "x flash", "peak MB", "x flash", "first call s", "note"]
        rows = [
            [c["prior"], c["route"], str(c["L"]), number(c.get("ms"), 2), number(c.get("x_flash_time"), 2)]
            + [number(c.get("peak_mb"), 0), number(c.get("x_flash_memory"), 2), number(c.get("first_s"), 1)]
            + [
                c.get("error")
                or c.get("skipped")
                or (f"auto: {c['auto_takes']}" if "auto_takes" in c else "")
            ]
            for c in p["cells"]
        ]
        lines += table(header, rows) + [f"- {n}" for n in p["notes"]]
    p = parts.get("training")
    if p and "settings" in p:
        s = p["settings"]
        lines += ["## Training throughput", ""]
        lines += [
            f"Batch {s['batch']}, {s['steps']} steps after {s['warmup_steps']} warm-up steps, {s['dtype']}.",
            "",
        ]
        header = [
            "preset",
            "prior",
            "policy",
            "compiled",
            "tokens/s",
            "ms/step",
            "warm-up s",
            "peak MB",
            "note",
        ]
        rows = [
            [c["preset"], c["prior"], c.get("policy", "auto"), "yes" if c["compiled"] else "no"]
            + [number(c.get("tokens_per_s"), 0)]
            + [number(c.get("ms_per_step"), 1), number(c.get("warmup_s"), 1), number(c.get("peak_mb"), 0)]
            + [c.get("error") or c.get("skipped") or ""]
            for c in p["cells"]
        ]
        lines += table(header, rows) + [f"- {n}" for n in p["notes"]]
    return "\n".join(lines) + "\n"


def set_recompile_limits() -> None:
    """FlexAttention and the compiled training cells compile once per shape and prior: more than
    dynamo's default of 8 graphs per function, beyond which it would fall back to eager."""
    for limit in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit"):
        if hasattr(torch._dynamo.config, limit):
            setattr(torch._dynamo.config, limit, 256)


def default_out() -> Path:
    out = os.environ.get("OUT")
    return Path(out) / "device_check" if out else Path.home() / ".cache" / "priorattn" / "device_check"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-pytest"]:
        return run_pytest(argv[1:])
    if argv[:1] == ["--run-train-cell"]:
        return run_train_cell(*argv[1:5])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=default_out(), help="where the JSON and markdown go")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--budget", type=float, default=470.0, help="seconds for all the parts together")
    parser.add_argument("--lengths", type=int, nargs="+", help="attention lengths (default 1024 to 32768)")
    parser.add_argument(
        "--routes", nargs="+", help="explicit routes measured beside auto (default triton, flex, sdpa)"
    )
    parser.add_argument("--presets", nargs="+", help="training presets (default tiny and small)")
    parser.add_argument("--priors", nargs="+", help="attention priors measured (default all), by name")
    parser.add_argument(
        "--train-policies",
        nargs="+",
        choices=TRAIN_POLICIES,
        help="route policies of the training cells (default auto; fused: Triton at every length)",
    )
    args = parser.parse_args(argv)
    stand_ins = stand_in_for_missing()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    sizes = GPU if cuda else DRY
    if args.lengths:
        sizes = dataclasses.replace(sizes, lengths=tuple(args.lengths))
    if args.presets:
        sizes = dataclasses.replace(sizes, presets=tuple(args.presets))
    if args.routes:
        ROUTES_MEASURED[:] = args.routes
    PRIORS_MEASURED.extend(args.priors or ())
    POLICIES_MEASURED[:] = args.train_policies or POLICIES_MEASURED
    set_recompile_limits()
    report = Report(
        args.out,
        dict(
            device=torch.cuda.get_device_name(device) if cuda else "CPU (no CUDA GPU)",
            torch=torch.__version__,
            cuda=torch.version.cuda,
            date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            command="python benchmarks/device_check.py " + " ".join(argv),
            dry_run=not cuda,
            stand_ins=stand_ins,
        ),
    )
    end = time.time() + args.budget
    chosen = [part for part in PARTS if part in args.parts]
    for i, name in enumerate(chosen):
        left = sum(SHARES[p] for p in chosen[i:])
        deadline = time.time() + (end - time.time()) * SHARES[name] / left
        try:
            if name == "pytest":
                pytest_part(report, deadline, dry=not cuda)
            elif name == "attention":
                attention_part(report, deadline, sizes, device)
            else:
                training_part(report, deadline, sizes, device)
        except Exception as e:  # e.g. the library failed to import: the other parts still run
            report.part(name)["error"] = error_text(e)
            report.part(name)["traceback"] = traceback.format_exc()
        report.save()
    if cuda:
        print(f"device check on {report.data['device']}: {args.out / 'device_check.md'}")
        print((args.out / "device_check.md").read_text())
    else:
        print(
            f"no CUDA GPU here: ran the device check's dry run on the CPU (nothing measured), in {args.out}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
