"""Small IDX files written by the tests: the format by hand, independent of the reader."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

TYPE_CODES = {np.dtype("uint8"): 0x08, np.dtype("int16"): 0x0B, np.dtype("float32"): 0x0D}


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX: two zero bytes, the type code, the number of dimensions, big-endian sizes and values."""
    header = bytes([0, 0, TYPE_CODES[array.dtype], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: np.ndarray) -> Path:
    data = idx_bytes(array)
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def striped_images(labels: np.ndarray, seed: int) -> np.ndarray:
    """28 x 28 images whose class is a horizontal stripe's row band, plus noise: learnable in a few steps."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 60, size=(len(labels), 28, 28), dtype=np.uint8)
    for image, label in zip(images, labels):
        image[label * 2 + 4 : label * 2 + 6] = 255
    return images
