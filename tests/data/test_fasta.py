"""The FASTA reader and genome regions as a corpus, on small files written here (and on the real
ragout-examples genomes when `make genomes` has fetched them)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from priorattn.data import load_corpus, split_documents
from priorattn.data.fasta import fasta_documents, read_fasta

GENOMES = Path("~/.cache/priorattn/genomes").expanduser()


def write(path: Path, text: str) -> Path:
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["g.fa", "g.fasta.gz"])
def test_records_join_wrapped_lines_in_upper_case(tmp_path, name):
    text = ">chr1 E. coli test\nACGTac\ngtNN\r\n\n>plasmid\nacgu\nRYKM\n"
    records = read_fasta(write(tmp_path / name, text))
    assert [(r.name, r.description) for r in records] == [("chr1", "E. coli test"), ("plasmid", "")]
    # lower case is upper case, U is T, the IUPAC codes for several bases are N
    assert [r.sequence for r in records] == ["ACGTACGTNN", "ACGTNNNN"]


def test_comment_lines_are_skipped(tmp_path):
    [record] = read_fasta(write(tmp_path / "g.fa", ";old-style comment\n>r\nAC\n;inside\nGT\n"))
    assert record.sequence == "ACGT"


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "holds no FASTA record (no '>' header line): an empty FASTA file"),
        ("ACGT\n>r\nAC\n", "g.fa:1: sequence before the first '>' header line"),
        (">r\nACGT\n>s\n", "g.fa:3: record 's' has no sequence"),
        (">\nACGT\n", "g.fa:1: a '>' header line without a record name"),
        (">r\nAC\n>r\nGT\n", "record names must be unique, repeated: ['r']"),
        (">r\nACGT\nAC-GT\n", "g.fa:3: '-' in record 'r' is not a nucleotide"),
        (">r\nAC7T\n", "g.fa:2: '7' in record 'r' is not a nucleotide"),
    ],
)
def test_bad_fasta_is_a_clear_error(tmp_path, text, message):
    with pytest.raises(ValueError) as error:
        read_fasta(write(tmp_path / "g.fa", text))
    assert message in str(error.value)


def test_a_corrupt_gzip_file_is_a_clear_error(tmp_path):
    path = tmp_path / "g.fa.gz"
    path.write_bytes(gzip.compress(b">r\nACGT\n")[:12])
    with pytest.raises(ValueError, match="g.fa.gz cannot be read as FASTA"):
        read_fasta(path)


def test_records_are_cut_into_named_regions_in_genome_order(tmp_path):
    write(tmp_path / "a.fa", ">chr\n" + "ACGT" * 5 + "\n>p\nGG\n")
    docs = fasta_documents(tmp_path / "a.fa", region=8)
    assert [d.name for d in docs] == ["a.fa:chr#0", "a.fa:chr#1", "a.fa:chr#2", "a.fa:p#0"]
    assert "".join(d.read() for d in docs[:3]) == "ACGT" * 5
    assert [len(d.read()) for d in docs] == [8, 8, 4, 2]


def test_a_directory_gives_its_fasta_files_by_relative_path(tmp_path):
    (tmp_path / "refs").mkdir()
    write(tmp_path / "refs" / "x.fasta.gz", ">r\nAC\n")
    write(tmp_path / "y.fna", ">s\nGT\n")
    write(tmp_path / "notes.txt", "not a genome")
    names = [d.name for d in load_corpus(f"fasta:{tmp_path}")]
    assert names == ["refs/x.fasta.gz:r#0", "y.fna:s#0"]


def test_fasta_sources_name_what_is_missing(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file or directory .`make genomes`"):
        load_corpus(f"fasta:{tmp_path / 'missing'}")
    with pytest.raises(ValueError, match="no FASTA files"):
        load_corpus(f"fasta:{tmp_path}")


def test_validation_regions_are_held_out_whole(tmp_path):
    write(tmp_path / "g.fa", ">chr\n" + "ACGTTGCA" * 400 + "\n")
    train, val = split_documents(fasta_documents(tmp_path / "g.fa", region=100))
    assert len(val) == 3 and len(train) == 29
    assert not {d.name for d in train} & {d.name for d in val}
    regions = sorted(train + val, key=lambda d: d.name)
    assert "".join(d.read() for d in regions) == "ACGTTGCA" * 400


@pytest.mark.skipif(not GENOMES.is_dir(), reason="`make genomes` has not fetched ragout-examples")
def test_the_packaged_e_coli_genome_reads_as_one_record_of_bases():
    [record] = read_fasta(next(GENOMES.rglob("MG1655-K12.fasta.gz")))
    assert 4_500_000 < len(record.sequence) < 4_800_000
    assert set(record.sequence) <= set("ACGTN")
