"""Genomes as corpora: a FASTA reader, and genome regions as documents (seed 000 Fig. 4).

A FASTA file holds records, each a ``>`` header line followed by sequence lines wrapped at any
width. :func:`read_fasta` joins the lines, reads lower case (soft-masked repeats) as upper case, ``U``
as ``T``, and every IUPAC code for more than one base (``R Y S W K M B D H V``) as ``N``, so a
sequence holds ``A C G T N`` only: a nucleotide-level model sees one byte per base. Anything else
(a gap ``-``, a digit, a stray character) is an error naming the file and line.

:func:`fasta_documents` cuts every record into regions of :data:`REGION_BASES` bases, named
``"<file>:<record>#<region>"``. The corpus split is by document (:func:`~.corpus.split_documents`),
so validation is a set of whole regions held out of the genome: no base is in both splits.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path

from .document import Document

#: Bases per document; a genome of 4.6 Mb gives 71 regions, long enough for long-context windows.
REGION_BASES = 65536
FASTA_SUFFIXES = (".fa", ".fasta", ".fna", ".fas", ".ffn")
# Upper case and lower case read alike; U (RNA) is T; the IUPAC codes for two or more bases are N.
_NORMALIZE = str.maketrans("acgtnuU" + "RYSWKMBDHVryswkmbdhv", "ACGTNTT" + "N" * 20)
_BASES = frozenset("ACGTN")


@dataclass(frozen=True)
class FastaRecord:
    """One record: ``name`` (the header's first word), the rest of the header, and the sequence
    (``A C G T N``, lines joined)."""

    name: str
    description: str
    sequence: str


def is_fasta(path: Path) -> bool:
    """Whether ``path`` is named like a FASTA file (``.fa``, ``.fasta``, ``.fna``, ...; or ``.gz`` of one)."""
    name = path.name.lower().removesuffix(".gz")
    return name.endswith(FASTA_SUFFIXES)


def read_fasta(path: str | Path) -> list[FastaRecord]:
    """The records of the FASTA file ``path`` (gzip-compressed if it ends in ``.gz``), in file order.

    Raises ``ValueError`` naming the file (and line) for: no record, a sequence line before the first
    header, a record with an empty name or no sequence, two records of one name, and a character
    that is neither a base nor an IUPAC code.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    records, header, lines = [], None, []
    try:
        with opener(path, "rt", encoding="latin-1") as file:  # any byte decodes; bad ones fail below
            for number, line in enumerate(file, 1):
                line = line.rstrip("\r\n")
                if line.startswith(">"):
                    if header is not None:
                        records.append(_record(path, header, lines))
                    header, lines = (number, line[1:].strip()), []
                elif line.startswith(";") or not line.strip():
                    continue  # a comment (old FASTA) or a blank line
                elif header is None:
                    raise ValueError(f"{path}:{number}: sequence before the first '>' header line")
                else:
                    lines.append((number, line.strip()))
    except (OSError, EOFError, gzip.BadGzipFile) as e:
        raise ValueError(f"{path} cannot be read as FASTA: {e}") from None
    if header is None:
        raise ValueError(f"{path} holds no FASTA record (no '>' header line): an empty FASTA file")
    records.append(_record(path, header, lines))
    names = [record.name for record in records]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{path}: record names must be unique, repeated: {repeated[:5]}")
    return records


def _record(path: Path, header: tuple[int, str], lines: list[tuple[int, str]]) -> FastaRecord:
    number, text = header
    name, _, description = text.partition(" ")
    if not name:
        raise ValueError(f"{path}:{number}: a '>' header line without a record name")
    if not lines:
        raise ValueError(f"{path}:{number}: record {name!r} has no sequence")
    for line_number, line in lines:
        bad = set(line.translate(_NORMALIZE)) - _BASES
        if bad:
            char = min(bad, key=line.translate(_NORMALIZE).index)
            raise ValueError(
                f"{path}:{line_number}: {char!r} in record {name!r} is not a nucleotide "
                "(A, C, G, T, U or an IUPAC code such as N)"
            )
    sequence = "".join(line for _, line in lines).translate(_NORMALIZE)
    return FastaRecord(name, description.strip(), sequence)


def fasta_files(source: Path) -> list[Path]:
    """``source`` itself, or the FASTA files under the directory ``source`` (recursively), sorted."""
    if source.is_file():
        return [source]
    if source.is_dir():
        return sorted(p for p in source.rglob("*") if p.is_file() and is_fasta(p))
    raise FileNotFoundError(
        f"corpus source 'fasta:{source}': no such file or directory (`make genomes` fetches bacterial "
        "genomes, the Debian package ragout-examples, into ~/.cache/priorattn/genomes)"
    )


def fasta_documents(source: str | Path, region: int = REGION_BASES) -> list[Document]:
    """Every record of the FASTA file or directory ``source`` cut into regions of ``region`` bases,
    named ``"<file>:<record>#<region>"`` (file relative to a directory ``source``; regions
    zero-padded, so they sort in genome order). A region's text is its bases."""
    source = Path(source).expanduser()
    files = fasta_files(source)
    if not files:
        raise ValueError(f"corpus source 'fasta:{source}': no FASTA files ({', '.join(FASTA_SUFFIXES)}, .gz)")
    documents = []
    for path in files:
        file_name = path.name if path == source else path.relative_to(source).as_posix()
        for index, record in enumerate(_cached_records(path, path.stat().st_mtime_ns)):
            starts = range(0, len(record.sequence), region)
            width = len(str(len(starts) - 1))
            for i, start in enumerate(starts):
                read = partial(_region, path, index, start, start + region)
                documents.append(Document(f"{file_name}:{record.name}#{i:0{width}d}", read))
    return documents


@lru_cache(maxsize=8)
def _cached_records(path: Path, mtime_ns: int) -> list[FastaRecord]:
    """:func:`read_fasta`, parsed once per file version (every region of a genome reads from it)."""
    return read_fasta(path)


def _region(path: Path, record: int, start: int, end: int) -> str:
    return _cached_records(path, path.stat().st_mtime_ns)[record].sequence[start:end]
