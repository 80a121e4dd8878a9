"""Fixtures for the data tests: documents held in memory."""

import pytest

from priorattn.data import Document


def in_memory(texts: dict[str, str]) -> list[Document]:
    return [Document(name, lambda text=text: text) for name, text in texts.items()]


@pytest.fixture
def documents():
    """``documents(name=text, ...)``: in-memory documents in the order given."""
    return lambda **texts: in_memory(texts)
