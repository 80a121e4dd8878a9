"""The vision tests' data: a tiny Fashion-MNIST directory of IDX files written by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from idx_fixtures import striped_images, write_idx


@pytest.fixture
def fashion_dir(tmp_path) -> Path:
    """A directory laid out as ``make fashion-mnist`` leaves it, with 96 train and 40 test images."""
    root = tmp_path / "fashion-mnist"
    root.mkdir()
    for split, n, seed in (("train", 96, 0), ("t10k", 40, 1)):
        labels = np.arange(n, dtype=np.uint8) % 10
        write_idx(root / f"{split}-images-idx3-ubyte.gz", striped_images(labels, seed))
        write_idx(root / f"{split}-labels-idx1-ubyte.gz", labels)
    return root
