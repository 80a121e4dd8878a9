"""Retrieval evaluation: a model that always retrieves scores 1, one that never does scores 0."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from eval_fakes import InductionOracle

from priorattn.data import ByteTokenizer
from priorattn.data.retrieval import RetrievalTask, default_filler
from priorattn.eval import evaluate_retrieval, uniform_depths
from priorattn.eval.retrieval import score_answers
from priorattn.eval.scoring import answer_predictions
from priorattn.models import GPT, GPTConfig

TOKENIZER = ByteTokenizer()
CORPUS = np.frombuffer(("So foul and fair a day I have not seen. " * 60).encode(), dtype=np.uint8)


def task(name: str) -> RetrievalTask:
    return RetrievalTask(name, TOKENIZER, default_filler(name, TOKENIZER, CORPUS))


@pytest.mark.parametrize("name", ["passkey", "single_repeat", "single_corpus", "single_uuid", "multikey"])
def test_a_model_that_retrieves_scores_one_and_one_that_never_does_scores_zero(name):
    t = task(name)
    lengths = [t.min_length() + 40, t.min_length() + 150]
    options = dict(lengths=lengths, depths=uniform_depths(3), trials=2, progress=False)
    right = evaluate_retrieval(InductionOracle(256), t, **options)
    wrong = evaluate_retrieval(InductionOracle(256, wrong=True), t, **options)
    for key in ("accuracy", "greedy_accuracy", "token_accuracy"):
        assert np.array_equal(right[key], np.ones((2, 3)))
        assert np.array_equal(wrong[key], np.zeros((2, 3)))
    assert right["by_length"] == [1.0, 1.0] and right["by_depth"] == [1.0, 1.0, 1.0]
    assert right["lengths"] == lengths and right["depths"] == [0.0, 0.5, 1.0]


def test_score_answers_counts_whole_answers_and_tokens():
    answers = torch.tensor([[1, 2, 3], [4, 5, 6]])
    exact, tokens = score_answers(torch.tensor([[1, 2, 3], [4, 0, 6]]), answers)
    assert exact.tolist() == [1.0, 0.0]
    assert tokens.tolist() == pytest.approx([1.0, 2 / 3])


def test_teacher_forcing_and_greedy_decoding_of_a_real_model_match_full_passes():
    """Both readings start from one prefill; each equals what full forward passes give."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=256, seq_len=64, d_model=32, n_layers=2, n_heads=2)
    model = GPT(GPTConfig(**sizes, prior="goat(num_freqs=3)"))
    model = model.double().eval()
    prompts, answers = torch.randint(0, 256, (3, 50)), torch.randint(0, 256, (3, 4))
    teacher, greedy = answer_predictions(model, prompts, answers, chunk=16)
    with torch.no_grad():
        logits, _, _ = model(torch.cat([prompts, answers[:, :-1]], 1))
    assert torch.equal(teacher, logits[:, -4:].argmax(-1))
    assert torch.equal(greedy, model.generate(prompts, 4, greedy=True)[:, 50:])


def test_results_are_deterministic_for_a_seed():
    t, model = task("single_corpus"), InductionOracle(256, wrong=False)
    options = dict(lengths=[200], depths=[0.5], trials=2, progress=False)
    a = evaluate_retrieval(model, t, seed=3, **options)
    assert a == evaluate_retrieval(model, t, seed=3, **options)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(lengths=[20]), "needs at least 88 tokens"),
        (dict(lengths=[200, -1]), "positive integers"),
        (dict(lengths=[200], trials=0), "trials must be an int >= 1, got 0"),
        (dict(lengths=[200], trials=True), "trials must be an int >= 1, got True"),
        (dict(lengths=[200], depths=[1.5]), "depths must be numbers in \\[0, 1\\], got \\[1.5\\]"),
        (dict(lengths=[200], depths=["ab"]), "depths must be numbers in \\[0, 1\\]"),
        (dict(lengths=[200], depths=[]), "depths must be numbers"),
        (dict(lengths=[200], seed=-1), "seed must be an int >= 0, got -1"),
        (dict(lengths=[200], seed=1.5), "seed must be an int >= 0, got 1.5"),
        (dict(lengths=[200], chunk=-2), "chunk must be an int >= 1, got -2"),
    ],
)
def test_bad_settings_are_refused(options, message):
    options = dict(depths=[0.5], progress=False) | options
    with pytest.raises(ValueError, match=message):
        evaluate_retrieval(InductionOracle(256), task("passkey"), **options)


def test_uniform_depths_span_zero_to_one():
    assert uniform_depths(20)[0] == 0.0 and uniform_depths(20)[-1] == 1.0
    assert np.allclose(np.diff(uniform_depths(20)), 1 / 19)
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="the number of depths must be a positive int"):
            uniform_depths(bad)
