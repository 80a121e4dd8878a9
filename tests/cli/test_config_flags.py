"""Flags derived from a config dataclass: named, typed and documented by its fields."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from priorattn.cli import parsing
from priorattn.cli.configs import Flag, add_config_flags, field_docs, given, help_text
from priorattn.cli.parsing import Parser, int_at_least, positive_number


@dataclass
class Toy:
    """A config of every kind of field a flag reads.

    - ``width``: how wide, in ``units``
      (a bullet runs on over its indented lines).
    - ``ratio``, ``scale``: two numbers.
    - ``pair_*``: the pair's parts.
    - ``normalizer``: a name or a number.

    - Not a field: ``width`` named here again.
    """

    width: int = 4
    ratio: float = 0.5
    scale: float | None = None
    switch: bool = False
    maybe: bool | None = None
    names: tuple[str, ...] = dataclasses.field(default_factory=lambda: ("a",))
    pair_betas: tuple[float, float] = (0.9, 0.95)
    spec: str | dict = "goat"
    normalizer: str | float = "softmax"
    path: str | None = None


def toy_parser(flags=None) -> Parser:
    parser = Parser(prog="toy")
    add_config_flags({"toy": parser}, Toy, "toy", flags)
    return parser


def help_of(parser: Parser, dest: str) -> str:
    """The help of ``dest``'s flag as ``--help`` shows it."""
    return help_text(next(action for action in parser._actions if action.dest == dest))


def test_every_field_is_a_flag_of_its_type():
    argv = ["--width", "3", "--ratio", "0.25", "--scale", "none", "--switch", "--no-maybe"]
    argv += ["--names", "a, b", "--pair-betas", "0.8,0.9", "--spec", "goat(R=4, slope=false)+alibi"]
    argv += ["--normalizer", "1.5", "--path", "none"]
    assert given(toy_parser().parse_args(argv), Toy) == dict(
        width=3,
        ratio=0.25,
        scale=None,
        switch=True,
        maybe=False,
        names=("a", "b"),
        pair_betas=(0.8, 0.9),
        spec="goat(R=4, slope=false)+alibi",
        normalizer=1.5,
        path="none",  # a str reads its text as it is
    )
    assert given(toy_parser().parse_args(["--normalizer", "entmax15"]), Toy) == {"normalizer": "entmax15"}


def test_a_flag_not_given_leaves_its_field_out():
    assert given(toy_parser().parse_args([]), Toy) == {}
    assert given(toy_parser().parse_args(["--width", "2"]), Toy, skip={"width"}) == {}


def test_the_help_is_the_fields_bullet_with_its_default():
    parser = toy_parser()
    assert help_of(parser, "width") == "how wide, in units (a bullet runs on over its indented lines). (4)"
    assert help_of(parser, "scale") == "ratio, scale: two numbers. (none)"
    assert help_of(parser, "pair_betas") == "pair_*: the pair's parts. (0.9,0.95)"
    assert help_of(parser, "switch") == "(off)"  # no bullet: the default alone
    assert help_of(parser, "names") == "(a)"
    assert field_docs(Toy)["width"].startswith("how wide")  # the first bullet naming it


def test_a_command_writes_a_flag_its_own_way():
    flags = {"width": Flag(type=int_at_least(2), metavar="W", help="columns ({default})")}
    flags["spec"] = Flag(choices=("goat", "alibi"), group="other")
    flags["scale"] = Flag(type=positive_number)  # and, as the field may be None, "none"
    parser = Parser(prog="toy")
    groups = {"toy": parser.add_argument_group("toy"), "other": parser.add_argument_group("other")}
    add_config_flags(groups, Toy, "toy", flags | {"gone": Flag(help="a field the config lost")})
    assert help_of(parser, "width") == "columns (4)"
    assert [a.dest for a in groups["other"]._group_actions] == ["spec"]
    assert given(parser.parse_args(["--width", "2", "--spec", "alibi"]), Toy) == dict(width=2, spec="alibi")
    assert given(parser.parse_args(["--scale", "none"]), Toy) == dict(scale=None)
    with pytest.raises(SystemExit):
        parser.parse_args(["--scale", "-1"])


def test_a_flag_of_another_name_keeps_the_fields_name_as_an_alias():
    parser = toy_parser({"width": Flag(name="w")})
    assert given(parser.parse_args(["--w", "2"]), Toy) == given(parser.parse_args(["--width", "2"]), Toy)
    assert parsing.flag_names("width must be >= 1", parser) == "--w must be >= 1"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--width", "wide"], "argument --width: expected an integer, got 'wide'"),
        (["--ratio", "inf"], "argument --ratio: must be a finite number, got inf"),
        (["--scale", "big"], "argument --scale: expected a number, got 'big'"),
        (["--pair-betas", "0.9"], "argument --pair-betas: expected 2 comma-separated values, got '0.9'"),
        (["--pair-betas", "0.9,x"], "argument --pair-betas: expected a number, got 'x'"),
        (["--switch=yes"], "argument --switch/--no-switch: ignored explicit argument 'yes'"),
    ],
)
def test_a_bad_value_is_a_one_line_error(capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        toy_parser().parse_args(argv)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        f"toy: error: {message}",
        "For more information, try 'toy --help'.",
    ]


def test_a_field_no_flag_can_read_is_refused_by_name():
    @dataclass
    class Nested:
        table: dict[str, int]

    with pytest.raises(TypeError, match="config field table has type dict"):
        add_config_flags({"g": Parser(prog="nested")}, Nested, "g")
