"""Fashion-MNIST from its original IDX files (Xiao et al., 2017), as the Debian package ships them.

``make fashion-mnist DATA=DIR`` fetches the package ``dataset-fashion-mnist`` without root
(``apt-get download`` + ``dpkg-deb -x``) and leaves the four gzipped IDX files in ``DIR``.

IDX (LeCun's MNIST format): two zero bytes, a type code, the number of dimensions ``n``, then ``n``
big-endian uint32 sizes and the values, big-endian, in C order.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path
from typing import NamedTuple

import numpy as np

#: IDX type codes and the big-endian numpy dtype of each.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
DEFAULT_DATA = Path.home() / ".cache" / "priorattn" / "fashion-mnist"
SPLIT_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
#: T-shirt/top, trouser, pullover, dress, coat, sandal, shirt, sneaker, bag, ankle boot.
NUM_CLASSES = 10


def parse_idx(data: bytes, name: str = "IDX data") -> np.ndarray:
    """The array an IDX file holds; a ``ValueError`` naming ``name`` and the problem otherwise."""
    if len(data) < 4:
        raise ValueError(f"{name} is not an IDX file: {len(data)} bytes, shorter than the 4-byte magic")
    zeros, code, ndim = data[:2], data[2], data[3]
    if zeros != b"\0\0" or code not in IDX_TYPES:
        raise ValueError(f"{name} is not an IDX file: magic {data[:4].hex()} (expected 0000 + type + ndim)")
    if ndim == 0:
        raise ValueError(f"{name} declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{name} is truncated: {len(data)} bytes, its {ndim}-D header needs {header}")
    shape = tuple(int(size) for size in np.frombuffer(data, ">u4", ndim, offset=4))
    dtype = np.dtype(IDX_TYPES[code])
    expected = header + int(np.prod(shape)) * dtype.itemsize
    if len(data) != expected:
        state = "truncated" if len(data) < expected else "longer than its header says"
        raise ValueError(
            f"{name} is {state}: shape {shape} of {dtype.name} needs {expected} bytes, got {len(data)}"
        )
    return np.frombuffer(data, dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file, gzipped when its name ends in ``.gz``."""
    path = Path(path)
    try:
        data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise ValueError(f"{path} is not a complete gzip file ({e}): fetch it again") from None
    return parse_idx(data, str(path))


class Split(NamedTuple):
    """Images ``(N, 28, 28)`` uint8 and labels ``(N,)`` int64 in ``0..9``."""

    images: np.ndarray
    labels: np.ndarray


def find_idx(root: Path, stem: str) -> Path | None:
    for name in (f"{stem}.gz", stem):
        if (root / name).is_file():
            return root / name
    return None


def load_split(root: Path, split: str) -> Split:
    """The ``"train"`` (60k) or ``"test"`` (10k) split of Fashion-MNIST from the IDX files in ``root``."""
    root = Path(root)
    paths = [find_idx(root, stem) for stem in SPLIT_FILES[split]]
    if None in paths:
        missing = SPLIT_FILES[split][paths.index(None)]
        raise FileNotFoundError(
            f"no Fashion-MNIST {missing}[.gz] in {root}: fetch it with `make fashion-mnist DATA={root}`"
        )
    images, labels = (read_idx(path) for path in paths)
    if images.ndim != 3 or images.dtype != np.uint8:
        got = f"{images.dtype} {images.shape}"
        raise ValueError(f"{paths[0]} must hold uint8 images (N, rows, cols), got {got}")
    if labels.shape != images.shape[:1]:
        raise ValueError(f"{paths[1]} holds {labels.shape} labels for {len(images)} images in {paths[0]}")
    if labels.size and labels.max() >= NUM_CLASSES:
        raise ValueError(f"{paths[1]} has label {labels.max()}; Fashion-MNIST has {NUM_CLASSES} classes")
    return Split(images, labels.astype(np.int64))
