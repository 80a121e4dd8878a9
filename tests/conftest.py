"""Shared fixtures, and the settings that make every run of the suite replayable.

Hypothesis runs under the "ci" profile unless told otherwise: derandomized (each property test
draws the same examples on every run, fixed by the test's source and the Hypothesis version), no
example database (nothing from earlier local runs is replayed), no deadline (the machine is
shared), and a failure prints its ``@reproduce_failure`` blob. ``--hypothesis-seed N`` explores
other examples: it switches to "ci-seeded", the same profile drawing from seed N. Every test starts
from ``torch.manual_seed`` of that seed (0 by default), so tests that draw unseeded tensors are
replayable too. The profile and seed are printed in the header (or, under ``-q``, the summary).
"""

import json
import os

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter (tests/functional/test_triton_route.py).
# Triton reads this when it is imported, so it is set before anything imports it.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
import factories
from factories import word_salad
from hypothesis import HealthCheck, settings

from priorattn.models import GPTConfig
from priorattn.priors import with_defaults
from priorattn.train import TrainConfig, train

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("ci-seeded", settings.get_profile("ci"), derandomize=False)
settings.load_profile("ci")


def run_seed(config) -> int | None:
    """The run's ``--hypothesis-seed`` as an integer, or None when none was given."""
    seed = config.getoption("--hypothesis-seed")
    if seed is None:
        return None
    try:
        return int(seed)
    except ValueError:
        raise pytest.UsageError(
            f"--hypothesis-seed must be an integer (it seeds torch too), got {seed!r}"
        ) from None


def pytest_configure(config):
    # Derandomized tests ignore --hypothesis-seed: a seed given without a profile selects the
    # seeded copy of the default profile so that it takes effect.
    if run_seed(config) is not None and config.getoption("--hypothesis-profile") is None:
        settings.load_profile("ci-seeded")


def replay_line(config) -> str:
    seed = run_seed(config)
    if settings.default.derandomize:
        draws, replay = "derandomized (examples fixed by each test's source)", "rerun the same command"
    elif seed is not None:
        draws, replay = f"seed {seed}", f"rerun with --hypothesis-seed {seed}"
    else:
        draws, replay = "a random seed per test", "add the @seed(...) that the failure prints"
    profile = settings.get_current_profile_name()
    return f"hypothesis profile {profile!r}, {draws}, torch seed {seed or 0}; to replay a failure: {replay}"


def pytest_report_header(config):
    return replay_line(config)


def pytest_terminal_summary(terminalreporter, config):
    if config.option.verbose < 0:  # -q hides the header
        terminalreporter.write_line(replay_line(config))


@pytest.fixture(autouse=True)
def torch_seed(request):
    """Each test draws its unseeded tensors from the same state, whatever ran before it."""
    torch.manual_seed(run_seed(request.config) or 0)


def pytest_generate_tests(metafunc):
    """A test taking ``prior_name`` runs on every prior case (``factories.PRIOR_NAMES``, read at
    collection rather than when this file loads), unless it parametrizes ``prior_name`` itself."""
    own = [
        [name.strip() for name in mark.args[0].split(",")] if isinstance(mark.args[0], str) else mark.args[0]
        for mark in metafunc.definition.iter_markers("parametrize")
    ]
    if "prior_name" in metafunc.fixturenames and not any("prior_name" in names for names in own):
        metafunc.parametrize("prior_name", factories.PRIOR_NAMES)


WORDS = "now is the winter of our discontent made glorious summer by this sun of york"


@pytest.fixture(scope="session")
def make_run(tmp_path_factory):
    """``make_run(**model_overrides)`` -> the run directory of a 2-layer model trained 6 steps on a
    word-salad corpus in tmp (one per set of overrides, shared by the whole session)."""
    root = tmp_path_factory.mktemp("tiny-runs")
    (root / "corpus").mkdir()
    corpus = word_salad(root / "corpus", WORDS, docs=4, length=400)
    runs = {}

    def make(**overrides):
        fields = dict(vocab_size=256, seq_len=32, d_model=32, n_layers=2, n_heads=2) | overrides
        fields["prior"] = with_defaults(fields.get("prior", "uniform"), goat=dict(num_freqs=2))
        model = GPTConfig(**fields)
        key = json.dumps(model.to_dict(), sort_keys=True)  # overrides at their defaults share a run
        if key not in runs:
            mp = pytest.MonkeyPatch()
            mp.setenv("PRIORATTN_CACHE", str(root / "cache"))
            run_dir = root / f"run{len(runs)}"
            config = TrainConfig(data=str(corpus), steps=6, batch_size=4, eval_sequences=2, lr=3e-3)
            train(model, config, run_dir, progress=False)
            mp.undo()
            runs[key] = run_dir
        return runs[key]

    return make


@pytest.fixture
def corpus_dir(tmp_path, monkeypatch):
    """A folder of four documents of random words, with token stores cached under tmp_path."""
    monkeypatch.setenv("PRIORATTN_CACHE", str(tmp_path / "cache"))
    words = "to be or not to be that is the question whether tis nobler in the mind".split()
    gen = torch.Generator().manual_seed(0)
    root = tmp_path / "corpus"
    root.mkdir()
    for i in range(4):
        picks = torch.randint(0, len(words), (600,), generator=gen).tolist()
        (root / f"doc{i}.txt").write_text(" ".join(words[j] for j in picks))
    return root
