"""Synthetic retrieval sequences: exact lengths, needle placement, answers, determinism, the mix."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from priorattn.data import Batches, ByteTokenizer, PackedSequences, TokenStore
from priorattn.data.retrieval import (
    MIX_TASKS,
    NIAH_VARIANTS,
    REPEATED_FILLER,
    CorpusFiller,
    RepeatedFiller,
    RetrievalMix,
    RetrievalTask,
    default_filler,
)

TASKS = ("passkey",) + NIAH_VARIANTS
TOKENIZER = ByteTokenizer()
CORPUS = np.frombuffer(("Now is the winter of our discontent. " * 40).encode(), dtype=np.uint8)


def make_task(name: str, tokenizer=TOKENIZER, **options) -> RetrievalTask:
    return RetrievalTask(name, tokenizer, default_filler(name, tokenizer, CORPUS), **options)


def find(sequence: list[int], part: list[int]) -> list[int]:
    """Every index where ``part`` occurs in ``sequence``."""
    n = len(part)
    return [i for i in range(len(sequence) - n + 1) if sequence[i : i + n] == part]


@pytest.mark.parametrize("name", TASKS)
@pytest.mark.parametrize("extra", [0, 1, 37, 1000])
def test_prompt_has_exactly_the_asked_length(name, extra):
    task = make_task(name)
    length = task.min_length() + extra
    for depth in (0.0, 0.3, 1.0):
        sample = task.sample(length, depth, np.random.default_rng(extra))
        assert len(sample.prompt) == length
        assert len(sample.answer) == task.answer_length()


def test_gpt2_tokenizer_keeps_exact_lengths_and_one_token_per_digit():
    from priorattn.data import BPETokenizer

    gpt2 = BPETokenizer.gpt2()
    for name in ("passkey", "single_uuid", "multiquery"):
        task = make_task(name, gpt2)
        sample = task.sample(task.min_length() + 50, 0.5, np.random.default_rng(0))
        assert len(sample.prompt) == task.min_length() + 50
    passkey = make_task("passkey", gpt2, digits=8)
    sample = passkey.sample(200, 0.5, np.random.default_rng(1))
    assert len(sample.answer) == 8 and gpt2.decode(sample.answer).isdigit()


@pytest.mark.parametrize("name", ["passkey", "single_repeat", "single_corpus", "single_uuid"])
@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.9, 1.0])
def test_single_needle_sits_at_its_depth_of_the_filler(name, depth):
    task = make_task(name)
    rng = np.random.default_rng(3)
    intro, needles, values, cue = task.parts(np.random.default_rng(3))
    sample = task.sample(400, depth, rng)
    n_filler = 400 - len(intro) - len(needles[0]) - len(cue)
    (start,) = sample.needle_starts
    assert start == len(intro) + round(depth * n_filler)
    assert sample.prompt[start : start + len(needles[0])] == needles[0]
    assert sample.prompt[-len(cue) :] == cue
    assert sample.answer == values[0]
    assert find(sample.prompt, sample.answer) == [start + needles[0].index(values[0][0])]


def test_depth_zero_follows_the_intro_and_depth_one_precedes_the_cue():
    task = make_task("passkey")
    intro, needles, _, cue = task.parts(np.random.default_rng(0))
    first = task.sample(300, 0.0, np.random.default_rng(0))
    last = task.sample(300, 1.0, np.random.default_rng(0))
    assert first.needle_starts == (len(intro),)
    assert last.needle_starts[0] + len(needles[0]) == 300 - len(cue)


def test_passkey_answer_is_its_digits_and_filler_is_the_classic_haystack():
    task = make_task("passkey", digits=8)
    sample = task.sample(500, 0.5, np.random.default_rng(5))
    text = TOKENIZER.decode(sample.prompt)
    answer = TOKENIZER.decode(sample.answer)
    assert len(answer) == 8 and answer.isdigit()
    assert f"The pass key is #{answer}." in text
    assert text.endswith("What is the pass key? The pass key is #")
    assert REPEATED_FILLER[:40] in text


def test_multikey_asks_one_key_among_distinct_distractors():
    task = make_task("multikey")
    sample = task.sample(600, 0.4, np.random.default_rng(2))
    text = TOKENIZER.decode(sample.prompt)
    keys = [text[s:].split(" for ")[1].split(" is ")[0] for s in decoded_starts(sample)]
    assert len(keys) == 4 and len(set(keys)) == 4
    asked = keys[sample.answer_needle]
    assert text.endswith(f"The magic number for {asked} is #")
    needle = TOKENIZER.decode(sample.prompt[sample.needle_starts[sample.answer_needle] :])
    assert needle.startswith(f" The magic number for {asked} is #{TOKENIZER.decode(sample.answer)}.")


def decoded_starts(sample) -> list[int]:
    """Character offsets of the needles (byte tokens: one character each for ASCII)."""
    return list(sample.needle_starts)


def test_multivalue_answer_lists_every_value_in_the_order_they_appear():
    task = make_task("multivalue")
    sample = task.sample(700, 0.7, np.random.default_rng(4))
    text = TOKENIZER.decode(sample.prompt)
    in_order = [text[s:].split(" is ")[1].split(".")[0] for s in sample.needle_starts]
    assert "#" + TOKENIZER.decode(sample.answer) == ", ".join(in_order)
    assert len({text[s:].split(" for ")[1].split(" is ")[0] for s in sample.needle_starts}) == 1
    assert sample.answer_needle == 0


def test_multiquery_answer_follows_the_question_order():
    task = make_task("multiquery")
    sample = task.sample(700, 0.2, np.random.default_rng(6))
    text = TOKENIZER.decode(sample.prompt)
    value_of = {
        text[s:].split(" for ")[1].split(" is ")[0]: text[s:].split(" is ")[1].split(".")[0]
        for s in sample.needle_starts
    }
    asked = text.split("What are the magic numbers for ")[1].split("?")[0].replace(" and ", ", ").split(", ")
    assert "#" + TOKENIZER.decode(sample.answer) == ", ".join(value_of[key] for key in asked)


def test_uuid_values_look_like_uuids():
    sample = make_task("single_uuid").sample(300, 0.5, np.random.default_rng(0))
    value = TOKENIZER.decode(sample.answer)
    assert [len(part) for part in value.split("-")] == [8, 4, 4, 4, 12]
    assert set(value) <= set("0123456789abcdef-")


def test_samples_are_a_function_of_the_seed():
    task = make_task("single_corpus")
    a = task.sample(300, 0.5, np.random.default_rng([1, 2]))
    b = task.sample(300, 0.5, np.random.default_rng([1, 2]))
    c = task.sample(300, 0.5, np.random.default_rng([1, 3]))
    assert a == b
    assert a.answer != c.answer


def test_corpus_filler_is_real_text_and_wraps_around():
    filler = CorpusFiller(np.arange(10))
    assert filler.take(25, np.random.default_rng(0))[:12] == [
        (filler.take(25, np.random.default_rng(0))[0] + i) % 10 for i in range(12)
    ]
    repeated = RepeatedFiller(TOKENIZER, "ab")
    assert repeated.take(5, np.random.default_rng(0)) == list(b"ababa")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: make_task("passkey").sample(20, 0.5, np.random.default_rng(0)), "too short"),
        (lambda: make_task("passkey").sample(200, 1.5, np.random.default_rng(0)), "depth"),
        (lambda: make_task("needle"), "unknown retrieval task"),
        (lambda: make_task("passkey", digits=0), "digits"),
        (lambda: make_task("multikey", needles=1), "needles"),
        (lambda: default_filler("single_corpus", TOKENIZER, None), "corpus_tokens"),
        (lambda: CorpusFiller([]), "no tokens"),
    ],
)
def test_bad_arguments_are_refused_clearly(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from priorattn.data import Document

    text = "To be, or not to be, that is the question. " * 200
    docs = [Document(f"d{i}", lambda i=i: text[i:]) for i in range(3)]
    store = TokenStore.build(docs, TOKENIZER, tmp_path_factory.mktemp("store") / "s")
    return PackedSequences(store, 192)


def test_mix_of_zero_is_the_plain_batches(packed):
    batches = Batches(packed, 8, seed=1)
    mix = RetrievalMix(batches, 0.0, TOKENIZER, packed.store.tokens, seed=1)
    for a, b in zip(mix.batch(3), batches.batch(3)):
        assert torch.equal(a, b)


def test_mix_replaces_rows_with_whole_retrieval_samples(packed):
    batches = Batches(packed, 64, seed=1)
    mix = RetrievalMix(batches, 0.5, TOKENIZER, packed.store.tokens, seed=1)
    tokens, targets, doc_ids = mix.batch(0)
    plain = batches.batch(0)[0]
    replaced = [i for i in range(64) if not torch.equal(tokens[i], plain[i])]
    assert 16 < len(replaced) < 48  # about half
    cues = {"What is the pass key?", "What is the magic number for"}
    for i in replaced:
        text = TOKENIZER.decode(tokens[i].tolist())
        assert any(cue in text for cue in cues)
        assert torch.equal(targets[i, :-1], tokens[i, 1:])  # the loss on every token, answer included
        assert (doc_ids[i] == 0).all()


def test_mix_is_the_same_batch_however_it_is_sharded(packed):
    mix = RetrievalMix(Batches(packed, 8, seed=2), 0.5, TOKENIZER, packed.store.tokens, seed=2)
    whole = mix.batch(5)
    shards = [mix.batch(5, rank, 2) for rank in range(2)]
    for part in range(3):
        assert torch.equal(whole[part][0::2], shards[0][part])
        assert torch.equal(whole[part][1::2], shards[1][part])
    assert all(torch.equal(a, b) for a, b in zip(mix.batch(5), whole))


def test_mix_refuses_a_sequence_too_short_for_its_samples(tmp_path, packed):
    store = packed.store
    with pytest.raises(ValueError, match="too short for retrieval samples"):
        RetrievalMix(Batches(PackedSequences(store, 64), 4, seed=0), 0.5, TOKENIZER, store.tokens, seed=0)
    assert set(MIX_TASKS) <= set(TASKS)
