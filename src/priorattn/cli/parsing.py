"""What every command's parser shares: the parser class with one-line errors, the library's
argument names written as flags in those errors, and the argparse ``type``s that read numbers and
lists with a message naming what was expected."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are the one-line error and a line pointing to ``--help``
    (as cargo's), not the whole usage first; subcommands' parsers are made of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\nFor more information, try '{self.prog} --help'.\n")


def fail(args: argparse.Namespace, error: Exception) -> NoReturn:
    """Exit with ``error`` as one usage line of the subcommand, with the library's argument names
    written as the flags a user types (see :func:`flag_names`)."""
    args.parser.error(flag_names(str(error), args.parser))


# Library arguments whose flag has another name, in the commands that write it by hand (a command
# whose flags come from a config names the flag's dest by the field: see cli.configs.Flag.name).
FLAG_ALIASES = {"warmup_steps": "warmup"}


def flag_names(message: str, parser: argparse.ArgumentParser) -> str:
    """``message`` with each argument name of ``parser``'s flags, where the library names an
    argument (``window=1``, ``lr must ...``), written as the flag: ``--window=1``, ``--lr must``;
    a bare ``window=`` becomes ``--window`` and ``greedy=True`` of a switch ``--greedy``; a flag
    whose dest is a nested config's field (``attention_options.heads``) answers to the field's
    name (``heads``). A flag is
    written by its first name (``--tau``, not its alias ``--scalar-tau``)."""
    flags = {action.dest: action for action in parser._actions if action.option_strings}
    flags |= {name: flags[dest] for name, dest in FLAG_ALIASES.items() if dest in flags}
    # a nested config's field (``attention_options.heads``) is named by the library as ``heads``
    nested = {dest.rpartition(".")[2]: action for dest, action in flags.items() if "." in dest}
    flags = nested | flags
    names = "|".join(sorted(map(re.escape, flags), key=len, reverse=True))
    pattern = re.compile(rf"(?<![\w.'-])({names})(=True\b|=|(?= must\b))")

    def flag(match: re.Match) -> str:
        action = flags[match[1]]
        bare = match[2] == "=" and match.string[match.end() :][:1] in ("", " ", ")", ",", ";")
        if bare or (match[2] == "=True" and action.nargs == 0):
            return action.option_strings[0]
        return action.option_strings[0] + match[2]

    return pattern.sub(flag, message)


def integer(text: str) -> int:
    """An argparse ``type`` accepting integers."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers ``>= low``, with a message naming the bound."""

    def parse(text: str) -> int:
        value = integer(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {value}")
        return value

    return parse


def number(text: str) -> float:
    """An argparse ``type`` accepting finite numbers."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not abs(value) < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def positive_number(text: str) -> float:
    """An argparse ``type`` accepting finite numbers ``> 0``."""
    value = number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def non_negative_number(text: str) -> float:
    """An argparse ``type`` accepting finite numbers ``>= 0``."""
    value = number(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def name_list(choices, kind: str) -> Callable[[str], list[str]]:
    """An argparse ``type`` for comma-separated names, each one of ``choices``."""

    def parse(text: str) -> list[str]:
        names = [part.strip() for part in text.split(",")]
        unknown = [name for name in names if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {kind} {unknown[0]!r}: use {','.join(choices)}")
        return names

    return parse


def mechanism_list(choices) -> Callable[[str], list[str]]:
    """An argparse ``type`` for comma-separated mechanisms, each one of ``choices`` or a prior spec
    that is one of them (``goat(slope=none)`` names ``goat_noslope``: the spec ``train --prior``
    takes). Commas inside a spec's parentheses do not split it."""
    from ..models.named import mechanism_of_spec

    def parse(text: str) -> list[str]:
        parts = [part.strip() for part in re.split(r",(?![^()]*\))", text)]
        named = [part if part in choices else mechanism_of_spec(part) for part in parts]
        unknown = [part for part, name in zip(parts, named) if name not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown mechanism {unknown[0]!r}: use a prior spec that is one of them (as "
                f"goat(slope=none), bam+ssmax) or one of {','.join(choices)}; a prior no mechanism "
                "names trains with priorattn train --prior SPEC and scores with priorattn eval"
            )
        return named

    return parse


def prior_specs() -> str:
    """The registered priors and how a spec writes them, for a ``--prior`` help."""
    from ..priors import names

    return (
        f"{', '.join(names())}, with options as goat(num_freqs=4, slope=false), or a sum such as alibi+goat"
    )


def ints_at_least(low: int) -> Callable[[str], list[int]]:
    """An argparse ``type`` for comma-separated integers ``>= low``: ``"256,512,1024"``."""
    parse = int_at_least(low)

    def parse_list(text: str) -> list[int]:
        return [parse(part.strip()) for part in text.split(",")]

    return parse_list


int_list = ints_at_least(1)
seed_list = ints_at_least(0)
index_list = ints_at_least(0)


def float_list(text: str) -> list[float]:
    """An argparse ``type`` for comma-separated finite numbers ``>= 0``: ``"0,1,4"``."""
    return [non_negative_number(part.strip()) for part in text.split(",")]


def positive_numbers(text: str) -> list[float]:
    """An argparse ``type`` for comma-separated finite numbers ``> 0``: ``"1,1,3"``."""
    return [positive_number(part.strip()) for part in text.split(",")]
