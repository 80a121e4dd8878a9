"""What a corpus is made of: named documents whose text loads on demand."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Document:
    """One document of a corpus: a stable, unique ``name`` and ``read()``, which loads its text."""

    name: str
    read: Callable[[], str]
