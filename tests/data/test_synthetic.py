"""Synthetic retrieval over a small vocabulary: lengths, depths, answers, one-hop layout, batches, errors;
the position tasks' answers, depths, chance levels and the content reader that fails them."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from priorattn.data import SYNTHETIC_TASKS, SyntheticTask, training_lengths
from priorattn.data.packing import IGNORE_INDEX
from priorattn.data.synthetic import (
    CONTENT_TASKS,
    FILLER_TOKENS,
    KEY_TOKENS,
    NEEDLE_TOKEN,
    QUERY_TOKEN,
    SPAN_ALPHABET,
    START_TOKEN,
    SYNTHETIC_VOCAB_SIZE,
    TEXT_TOKENS,
    TEXT_VOCAB_SIZE,
    VALUE_TOKENS,
    content_answers,
    span_count,
    text_tokens,
)


@st.composite
def cases(draw):
    """A content task with small counts, a length with up to 60 filler tokens, a depth and a seed."""
    name = draw(st.sampled_from(CONTENT_TASKS))
    counts = st.integers(1, 4)
    task = SyntheticTask(name, values=draw(counts), pairs=draw(counts), needles=draw(st.integers(2, 4)))
    length = task.min_length() + draw(st.integers(0, 60))
    depth = draw(st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0.0, 1.0)))
    return task, task.sample(length, depth, np.random.default_rng(draw(st.integers(0, 2**32))))


def query_length(task: SyntheticTask) -> int:
    k = task.values
    return {"passkey": 2 + k, "mqar": 1 + task.pairs * (1 + k), "niah": 2 + k}[task.name]


def needle_spans(task: SyntheticTask, sample) -> list[tuple[int, int]]:
    """``(start, stop)`` of each needle in the haystack; the mqar block counts as one."""
    k = task.values
    if task.name == "mqar":
        start = min(sample.needle_starts)
        return [(start, start + task.pairs * (1 + k))]
    size = {"passkey": 1 + k, "niah": 2 + k}[task.name]
    return [(start, start + size) for start in sample.needle_starts]


def filler_mask(task: SyntheticTask, sample) -> np.ndarray:
    """True where the sequence holds filler: not the start, a needle or the query part."""
    mask = np.ones(len(sample.tokens), dtype=bool)
    mask[0] = False
    mask[len(mask) - query_length(task) :] = False
    for start, stop in needle_spans(task, sample):
        mask[start:stop] = False
    return mask


def asked_span(task: SyntheticTask, sample) -> tuple[int, int]:
    return needle_spans(task, sample)[0]


def values(tokens: np.ndarray) -> np.ndarray:
    return tokens[tokens >= VALUE_TOKENS.start]


@settings(max_examples=300, deadline=None)
@given(cases())
def test_sample_has_the_asked_length_and_answer_count(case):
    task, sample = case
    n = len(sample.tokens)
    assert sample.tokens.dtype == np.int64 and sample.answer_mask.dtype == bool
    assert sample.tokens.shape == sample.answer_mask.shape == (n,)
    assert n == task.min_length() + filler_mask(task, sample).sum()
    assert sample.answer_mask.sum() == task.answer_length()
    assert sample.tokens[0] == START_TOKEN and not sample.answer_mask[0]
    assert sample.tokens.min() >= 0 and sample.tokens.max() < task.vocab_size


@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
@pytest.mark.parametrize("extra", [0, 1, 2, 17, 100, 4096])
def test_every_length_is_exact(name, extra):
    task = SyntheticTask(name)
    for depth in (0.0, 0.37, 1.0):
        sample = task.sample(task.min_length() + extra, depth, np.random.default_rng(extra))
        assert len(sample.tokens) == len(sample.answer_mask) == task.min_length() + extra


@settings(max_examples=300, deadline=None)
@given(cases())
def test_filler_holds_only_filler_tokens_and_nothing_else_does(case):
    task, sample = case
    filler = filler_mask(task, sample)
    in_filler_range = (sample.tokens >= FILLER_TOKENS.start) & (sample.tokens < FILLER_TOKENS.stop)
    np.testing.assert_array_equal(in_filler_range, filler)


@settings(max_examples=300, deadline=None)
@given(cases())
def test_asked_needle_lies_after_round_depth_of_the_filler(case):
    task, sample = case
    filler = filler_mask(task, sample)
    start, _ = asked_span(task, sample)
    assert filler[:start].sum() == round(sample.depth * filler.sum())


@pytest.mark.parametrize("name", CONTENT_TASKS)
@pytest.mark.parametrize("extra", [0, 1, 3, 40])
def test_depth_zero_is_right_after_the_start_and_one_right_before_the_query(name, extra):
    task = SyntheticTask(name)
    length = task.min_length() + extra
    for seed in range(20):  # a few filler gaps and many seeds: niah distractors often share the end gaps
        start, _ = asked_span(task, task.sample(length, 0.0, np.random.default_rng(seed)))
        assert start == 1
        _, stop = asked_span(task, task.sample(length, 1.0, np.random.default_rng(seed)))
        assert stop == length - query_length(task)


@pytest.mark.parametrize(
    ("name", "extra", "start"),
    [
        ("passkey", 10, 1 + 5),  # round(0.5 * 10) = 5 filler tokens before the needle
        ("passkey", 7, 1 + 4),  # round(3.5) = 4 (to even)
        ("passkey", 9, 1 + 4),  # round(4.5) = 4 (to even)
        ("mqar", 10, 1 + 5),
        ("mqar", 3, 1 + 2),
    ],
)
def test_depth_half_places_the_needle_at_half_the_filler(name, extra, start):
    task = SyntheticTask(name)
    sample = task.sample(task.min_length() + extra, 0.5, np.random.default_rng(0))
    assert asked_span(task, sample)[0] == start


def test_niah_depth_half_counts_only_filler_before_the_asked_needle():
    task = SyntheticTask("niah")  # needles of 1 + 1 + 4 = 6 tokens
    for seed in range(20):
        sample = task.sample(task.min_length() + 10, 0.5, np.random.default_rng(seed))
        before = sum(s < sample.needle_starts[0] for s in sample.needle_starts[1:])
        assert sample.needle_starts[0] == 1 + 5 + 6 * before
        assert list(sample.needle_starts[1:]) == sorted(sample.needle_starts[1:])


@settings(max_examples=300, deadline=None)
@given(cases())
def test_answers_are_the_asked_needles_values(case):
    task, sample = case
    tokens, k = sample.tokens, task.values
    query = tokens[len(tokens) - query_length(task) :]
    assert query[0] == QUERY_TOKEN
    answer_mask = np.zeros(len(tokens), dtype=bool)
    answer_mask[len(tokens) - len(query) :] = query >= VALUE_TOKENS.start
    np.testing.assert_array_equal(sample.answer_mask, answer_mask)
    start = sample.needle_starts[0]
    if task.name == "passkey":
        assert tokens[start] == NEEDLE_TOKEN and query[1] == NEEDLE_TOKEN
        np.testing.assert_array_equal(tokens[sample.answer_mask], tokens[start + 1 : start + 1 + k])
    elif task.name == "niah":
        keys = [tokens[s + 1] for s in sample.needle_starts]
        assert all(tokens[s] == NEEDLE_TOKEN for s in sample.needle_starts)
        assert len(set(keys)) == task.needles and all(key in KEY_TOKENS for key in keys)
        assert query[1] == keys[0]
        np.testing.assert_array_equal(tokens[sample.answer_mask], tokens[start + 2 : start + 2 + k])
    else:
        pairs = query[1:].reshape(task.pairs, 1 + k)  # (pairs, key v..) in query order
        for (key, *answer), needle in zip(pairs, sample.needle_starts):
            assert key == tokens[needle] and key in KEY_TOKENS
            np.testing.assert_array_equal(answer, tokens[needle + 1 : needle + 1 + k])
        block = min(sample.needle_starts)
        assert sorted(sample.needle_starts) == [block + j * (1 + k) for j in range(task.pairs)]
        assert len(set(pairs[:, 0])) == task.pairs
    haystack_values = values(tokens[: len(tokens) - len(query)])
    assert len(set(haystack_values.tolist())) == len(haystack_values)  # a sample's values are distinct


@settings(max_examples=300, deadline=None)
@given(cases())
def test_every_answer_token_is_one_hop_for_an_ideal_induction_model(case):
    """The token before an answer occurs once earlier in the sequence, right before the answer."""
    _, sample = case
    tokens = sample.tokens
    for p in np.flatnonzero(sample.answer_mask):
        earlier = [c for c in range(1, p) if tokens[c - 1] == tokens[p - 1]]
        assert len(earlier) == 1 and tokens[earlier[0]] == tokens[p]


def test_mqar_queries_every_key_in_a_random_order():
    task = SyntheticTask("mqar")
    orders = set()
    for seed in range(20):
        sample = task.sample(task.min_length() + 20, 0.5, np.random.default_rng(seed))
        orders.add(tuple(np.argsort(sample.needle_starts)))
    assert len(orders) > 5


def test_niah_distractors_go_at_varying_depths():
    task = SyntheticTask("niah")
    placements = {
        task.sample(task.min_length() + 50, 0.5, np.random.default_rng(seed)).needle_starts[1:]
        for seed in range(20)
    }
    assert len(placements) > 15


def test_default_sizes():
    sizes = {
        name: (SyntheticTask(name).min_length(), SyntheticTask(name).answer_length())
        for name in SYNTHETIC_TASKS
    }
    # passkey S | N v*4 | Q N v*4; mqar S | (key v*4)*4 | Q (key v*4)*4; niah S | (N key v*4)*4 | Q key v*4;
    # latest as niah, first one more (Q S key v*4); offset S | N v*4 | Q N v; span S | N s*8 | Q N s*8
    assert sizes == {
        "passkey": (12, 4),
        "mqar": (42, 16),
        "niah": (31, 4),
        "text_passkey": (12, 4),
        "latest": (31, 4),
        "first": (32, 4),
        "offset": (9, 1),
        "span": (20, 8),
    }
    vocab = {name: SyntheticTask(name).vocab_size for name in SYNTHETIC_TASKS}
    assert vocab == {name: SYNTHETIC_VOCAB_SIZE for name in SYNTHETIC_TASKS} | {
        "text_passkey": TEXT_VOCAB_SIZE
    }


def test_the_largest_counts_the_vocabulary_holds_build():
    for task in (SyntheticTask("mqar", pairs=24, values=1), SyntheticTask("niah", needles=6, values=4)):
        sample = task.sample(task.min_length() + 5, 0.5, np.random.default_rng(0))
        assert len(sample.tokens) == task.min_length() + 5


@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
def test_samples_are_pure_functions_of_the_seed(name):
    task = SyntheticTask(name)
    length = task.min_length() + 30

    def draw(seed):
        return task.sample(length, 0.4, np.random.default_rng(seed))

    first, again = draw(7), draw(7)
    np.testing.assert_array_equal(first.tokens, again.tokens)
    np.testing.assert_array_equal(first.answer_mask, again.answer_mask)
    assert first.needle_starts == again.needle_starts
    others = [draw(seed).tokens.tobytes() for seed in range(10)]
    assert len(set(others)) == 10


@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
@pytest.mark.parametrize("depth", [0.3, None])
def test_batch_rows_are_samples_with_targets_only_at_answers(name, depth):
    task = SyntheticTask(name)
    length = task.min_length() + 25
    inputs, targets = task.batch(6, length, np.random.default_rng(3), depth=depth)
    assert inputs.shape == targets.shape == (6, length - 1)
    assert inputs.dtype == targets.dtype == torch.int64
    rng = np.random.default_rng(3)
    rows = [task.sample(length, rng.random() if depth is None else depth, rng) for _ in range(6)]
    for b, row in enumerate(rows):
        tokens, answers = torch.from_numpy(row.tokens), torch.from_numpy(row.answer_mask)
        assert torch.equal(inputs[b], tokens[:-1])
        assert torch.equal(targets[b][answers[1:]], tokens[1:][answers[1:]])
        assert (targets[b][~answers[1:]] == IGNORE_INDEX).all()
    assert (targets != IGNORE_INDEX).sum() == 6 * task.answer_length()
    np.testing.assert_array_equal(
        rows[0].loss_mask, np.arange(length) > 0 if name == "text_passkey" else rows[0].answer_mask
    )
    if depth is None:
        assert len({row.depth for row in rows}) == 6


def mqar():
    return SyntheticTask("mqar")


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: SyntheticTask("copy"), "name"),
        (lambda: SyntheticTask("passkey", values=0), "values"),
        (lambda: SyntheticTask("passkey", values=2.0), "values"),
        (lambda: SyntheticTask("passkey", values=True), "values"),
        (lambda: SyntheticTask("passkey", values=25), "values"),
        (lambda: SyntheticTask("mqar", pairs=0), "pairs"),
        (lambda: SyntheticTask("mqar", pairs=25, values=1), "pairs"),
        (lambda: SyntheticTask("mqar", pairs=7), "pairs * values"),
        (lambda: SyntheticTask("niah", needles=1), "needles"),
        (lambda: SyntheticTask("niah", needles="4"), "needles"),
        (lambda: SyntheticTask("niah", needles=7), "needles * values"),
        (lambda: SyntheticTask("latest", needles=7), "needles * values"),
        (lambda: SyntheticTask("offset", offset=1), "offset"),
        (lambda: SyntheticTask("offset", offset=5), "offset"),
        (lambda: SyntheticTask("span", span=4), "span"),
        (lambda: mqar().sample(41, 0.5, np.random.default_rng(0)), "length"),
        (lambda: mqar().sample(50.0, 0.5, np.random.default_rng(0)), "length"),
        (lambda: mqar().sample(50, -0.1, np.random.default_rng(0)), "depth"),
        (lambda: mqar().sample(50, 1.5, np.random.default_rng(0)), "depth"),
        (lambda: mqar().sample(50, float("nan"), np.random.default_rng(0)), "depth"),
        (lambda: mqar().sample(50, "0.5", np.random.default_rng(0)), "depth"),
        (lambda: mqar().batch(0, 50, np.random.default_rng(0)), "batch_size"),
        (lambda: mqar().batch(2, 50, np.random.default_rng(0), depth=2.0), "depth"),
        (lambda: training_lengths(10, 0, np.random.default_rng(0)), "min_len"),
        (lambda: training_lengths(5, 10, np.random.default_rng(0)), "max_len"),
        (lambda: training_lengths(10.5, 1, np.random.default_rng(0)), "max_len"),
    ],
)
def test_bad_input_raises_a_one_line_value_error_naming_the_argument(call, argument):
    with pytest.raises(ValueError, match=rf"^{re.escape(argument)} must") as error:
        call()
    assert "\n" not in str(error.value)


def test_training_lengths_stay_in_range_and_cover_it():
    rng = np.random.default_rng(0)
    drawn = [training_lengths(12, 8, rng) for _ in range(500)]
    assert set(drawn) == set(range(8, 13)) and all(isinstance(n, int) for n in drawn)
    assert training_lengths(20, 20, rng) == 20


def asked_needle(task: SyntheticTask, sample) -> tuple[int, int]:
    """``(start, stop)`` of the needle a position task asks about."""
    size = {"latest": 2 + task.values, "first": 2 + task.values, "span": 1 + task.span}.get(
        task.name, 1 + task.values
    )
    return sample.needle_starts[0], sample.needle_starts[0] + size


def haystack_before(task: SyntheticTask, sample, start: int) -> int:
    """Haystack tokens before index ``start``: neither the start token nor a needle's."""
    needles = [asked_needle(task, sample)[1] - asked_needle(task, sample)[0]] * len(sample.needle_starts)
    return start - 1 - sum(size for s, size in zip(sample.needle_starts, needles) if s < start)


@pytest.mark.parametrize("name", ["text_passkey", "latest", "first", "offset", "span"])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_position_tasks_put_the_asked_needle_at_the_depth_and_answer_from_it(name, depth):
    task = SyntheticTask(name)
    for seed in range(20):
        length = task.min_length() + 7 * seed
        sample = task.sample(length, depth, np.random.default_rng(seed))
        tokens, answers = sample.tokens, sample.tokens[sample.answer_mask]
        start, stop = asked_needle(task, sample)
        n_haystack = length - task.min_length()
        question = len(tokens) - len(answers) - (3 if name == "first" else 2)  # Q S key, Q key or Q N
        assert len(tokens) == length and sample.answer_mask.sum() == task.answer_length()
        assert haystack_before(task, sample, start) == round(depth * n_haystack)
        assert tokens[start] == NEEDLE_TOKEN and tokens[question] == QUERY_TOKEN
        assert (tokens[question + 1] == START_TOKEN) == (name == "first")
        if name in ("latest", "first"):
            key = tokens[start + 1]
            assert [tokens[s + 1] for s in sample.needle_starts] == [key] * task.needles
            others = sample.needle_starts[1:]
            assert all(s < start for s in others) if name == "latest" else all(s > start for s in others)
            np.testing.assert_array_equal(answers, tokens[start + 2 : stop])
        elif name == "offset":
            np.testing.assert_array_equal(answers, tokens[start + task.offset])
        else:
            np.testing.assert_array_equal(answers, tokens[start + 1 : stop])
        haystack = np.ones(length, dtype=bool)
        haystack[0] = False
        haystack[question:] = False
        for s in sample.needle_starts:
            haystack[s : s + stop - start] = False
        kinds = TEXT_TOKENS if name == "text_passkey" else FILLER_TOKENS
        assert ((tokens[haystack] >= kinds.start) & (tokens[haystack] < kinds.stop)).all()
        assert haystack.sum() == n_haystack


def test_text_passkey_haystack_is_a_window_of_the_corpus_text():
    task, text = SyntheticTask("text_passkey"), text_tokens()
    sample = task.sample(task.min_length() + 200, 1.0, np.random.default_rng(3))
    window = sample.tokens[1:201]
    starts = np.flatnonzero(text[: len(text) - 200] == window[0])
    assert any((text[s : s + 200] == window).all() for s in starts)
    assert sample.loss_mask[1:].all() and not sample.loss_mask[0]


def test_span_draws_repeats_from_three_tokens_and_the_span_count_is_exact():
    task = SyntheticTask("span")
    for seed in range(50):
        sample = task.sample(task.min_length(), 0.5, np.random.default_rng(seed))
        assert len(set(sample.tokens[sample.answer_mask].tolist())) == SPAN_ALPHABET
    # span 5 over {a, b, c}: 36 spans use all three and fail the content reader (a separate
    # enumeration of the rule, written apart from span_count, found the same 36, 306, 1458 and 5364)
    assert span_count(5) == 36


@pytest.mark.parametrize(
    ("name", "chance"),
    [
        ("passkey", 1 / (24 * 23 * 22 * 21)),
        ("text_passkey", 1 / (24 * 23 * 22 * 21)),
        ("latest", 1 / (24 * 23 * 22 * 21)),
        ("first", 1 / (24 * 23 * 22 * 21)),
        ("offset", 1 / 24),
        ("span", 1 / (2024 * 5364)),  # C(24, 3) alphabets x 5364 spans of 8
    ],
)
def test_chance_level_is_the_best_blind_guess(name, chance):
    assert SyntheticTask(name).chance() == pytest.approx(chance, rel=1e-12)


def test_offset_answers_are_uniform_over_the_values():
    """The best blind guess of an offset answer is right 1 in 24: every value is as likely."""
    task = SyntheticTask("offset")
    drawn = [
        int(task.sample(task.min_length(), 0.5, np.random.default_rng(s)).tokens[-1]) for s in range(4800)
    ]
    counts = np.bincount(np.asarray(drawn) - VALUE_TOKENS.start, minlength=24)
    assert counts.min() > 140 and counts.max() < 260  # 200 each; 4 sigma is 56


@pytest.mark.parametrize("context", [1, 2])
@pytest.mark.parametrize("name", SYNTHETIC_TASKS)
def test_position_tasks_fail_the_content_reader(name, context):
    """The control: a reader of content alone (with or without a token shift's pair of tokens)
    answers every content task and text passkey exactly, and no latest, first, offset or span one."""
    task = SyntheticTask(name)
    passed = [
        content_answers(sample.tokens, sample.answer_mask, context)
        for seed in range(30)
        for sample in [task.sample(task.min_length() + 3 * seed, seed / 29, np.random.default_rng(seed))]
    ]
    assert all(passed) if name in (*CONTENT_TASKS, "text_passkey") else not any(passed)


def test_the_content_reader_reads_the_token_after_the_match():
    q, n, a, b, c = QUERY_TOKEN, NEEDLE_TOKEN, *VALUE_TOKENS[:3]
    tokens = np.array([START_TOKEN, n, a, b, n, c, q, n, a])
    last = np.arange(len(tokens)) == len(tokens) - 1
    assert not content_answers(tokens, last, 1)  # N is followed by a and by c
    tokens[5] = a
    assert content_answers(tokens, last, 1)
    assert not content_answers(np.array([START_TOKEN, q, a]), np.array([False, False, True]), 2)  # no match
