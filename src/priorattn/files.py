"""Files written atomically: a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp_path)``, flush it to disk, then rename it to ``path``."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def sha256_of(*paths: Path) -> str:
    """The sha256 of the files' bytes, one after the other in the order given, read in 16 MiB blocks."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


def as_saved(data: dict) -> dict:
    """``data`` as it reads back from a JSON file (tuples become lists): what to compare with a
    saved record."""
    return json.loads(json.dumps(data))


def write_json_atomic(path: Path, data: dict) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8"))


def check_text_encoding(text_encoding: str) -> None:
    """Refuse a name that is not a Python text codec, before any file is read."""
    try:
        codecs.lookup(text_encoding)
    except (LookupError, TypeError):
        raise ValueError(
            f"text_encoding={text_encoding!r} is not a known text encoding (e.g. 'utf-8', 'latin-1')"
        ) from None


def prepare_out(out: Path) -> Path:
    """The output directory ``out``, created if missing; a file there is refused, naming it."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"the output directory {out} is a file")
    out.mkdir(parents=True, exist_ok=True)
    return out


def read_json(path: Path):
    """A JSON file's data; a file that does not parse is a ValueError naming it (not the parser's
    bare message)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}): repair or remove it") from None
