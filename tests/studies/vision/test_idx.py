"""The IDX reader and the Fashion-MNIST loader, on IDX files the tests write (and corrupt)."""

from __future__ import annotations

import gzip

import numpy as np
import pytest
from idx_fixtures import idx_bytes, write_idx

from priorattn.studies.vision import load_split, parse_idx, read_idx


@pytest.mark.parametrize("dtype", ["uint8", "int16", "float32"])
def test_read_idx_round_trips_plain_and_gzipped(tmp_path, dtype):
    array = (np.arange(2 * 3 * 5) - 7).reshape(2, 3, 5).astype(dtype)
    for name in ("a-idx3", "a-idx3.gz"):
        got = read_idx(write_idx(tmp_path / name, array))
        assert got.dtype == np.dtype(dtype) and got.dtype.isnative
        assert np.array_equal(got, array)


def test_parse_idx_reads_the_header_by_hand():
    data = bytes([0, 0, 0x08, 2, 0, 0, 0, 2, 0, 0, 0, 3]) + bytes(range(6))
    assert parse_idx(data).tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.parametrize(
    "data, message",
    [
        (b"\0\0", "shorter than the 4-byte magic"),
        (b"\x1f\x8b\x08\x00" + bytes(20), "magic 1f8b0800"),
        (bytes([0, 0, 0x07, 1, 0, 0, 0, 1, 0]), "magic 00000701"),
        (bytes([0, 0, 0x08, 0]), "declares 0 dimensions"),
        (bytes([0, 0, 0x08, 3, 0, 0, 0, 2]), "truncated: 8 bytes, its 3-D header needs 16"),
        (
            idx_bytes(np.zeros((4, 4), np.uint8))[:-3],
            r"truncated: shape \(4, 4\) of uint8 needs 28 bytes, got 25",
        ),
        (idx_bytes(np.zeros(3, np.uint8)) + b"\0", "longer than its header says"),
    ],
)
def test_parse_idx_names_what_is_wrong(data, message):
    with pytest.raises(ValueError, match=message):
        parse_idx(data, "x.idx")


def test_read_idx_refuses_a_truncated_gzip_file(tmp_path):
    path = tmp_path / "labels.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros(100, np.uint8)))[:-10])
    with pytest.raises(ValueError, match="labels.gz is not a complete gzip file"):
        read_idx(path)


def test_load_split_reads_images_and_labels(fashion_dir):
    train = load_split(fashion_dir, "train")
    assert train.images.shape == (96, 28, 28) and train.images.dtype == np.uint8
    assert train.labels.dtype == np.int64 and train.labels[:12].tolist() == [*range(10), 0, 1]
    assert len(load_split(fashion_dir, "test").labels) == 40


def test_load_split_says_how_to_fetch_missing_files(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"make fashion-mnist DATA=.*nowhere"):
        load_split(tmp_path / "nowhere", "train")


def test_load_split_refuses_labels_that_do_not_match(fashion_dir):
    write_idx(fashion_dir / "train-labels-idx1-ubyte.gz", np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match=r"holds \(5,\) labels for 96 images"):
        load_split(fashion_dir, "train")
    write_idx(fashion_dir / "train-labels-idx1-ubyte.gz", np.full(96, 10, np.uint8))
    with pytest.raises(ValueError, match="has label 10; Fashion-MNIST has 10 classes"):
        load_split(fashion_dir, "train")
