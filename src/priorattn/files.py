"""Files written atomically: a crash leaves the old file or the new one, never half of one."""

from __future__ import annotations

import codecs
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
