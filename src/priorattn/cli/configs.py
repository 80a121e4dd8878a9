"""Flags derived from a config dataclass: one per field, named, typed and documented by the field.

:func:`add_config_flags` gives every field of a dataclass a flag ``--field-name`` whose type
comes from the field's annotation and whose help is the field's bullet in the class docstring
(``- ``name``: ...``), so a field added to a config is a flag of every command built from it with
no edit here. A command may write a field's flag its own way with a :class:`Flag` (another name,
the field's staying an alias; the help text, a stricter type, choices, a group); a :class:`Flag`
for a field the config no longer has is unused.

A flag given nowhere on the command line leaves no attribute in the parsed namespace
(``argparse.SUPPRESS``), so :func:`given` returns exactly the fields the user wrote, with whatever
value they wrote: what the library merges with a saved run's config. A field that may be ``None``
reads ``none`` as ``None`` (but a text field, whose text may be ``none``); a ``bool`` field is a
switch ``--name`` / ``--no-name``; a ``list`` or ``tuple`` field reads comma-separated values.

A help never writes a default as text: it names ``%(shown_default)s`` (a flag's default as
:func:`shown` writes it, kept on the flag's action and filled in when the help is shown) or
argparse's ``%(default)s``, so what ``--help`` shows is what the code holds
(:func:`help_text`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from .parsing import integer, number, positive_number

UNIONS = (typing.Union, types.UnionType)

# What a field's flag reads, by the annotation's type: each a parser of one value's text.
SCALARS: dict[type, Callable[[str], object]] = {int: integer, float: number, str: str}


@dataclass(frozen=True)
class Flag:
    """How a command writes one field's flag, where it differs from the derived one.

    ``name`` is the flag's name where it is not the field's (``"warmup"`` for ``warmup_steps``:
    ``--warmup``, with ``--warmup-steps`` an alias; the dest stays the field's). ``help`` may name
    ``{default}`` (the field's default as the help shows it); ``type`` parses the text (and may
    return ``None``); ``choices`` are the values it accepts; ``group`` names the argument group
    (one of the groups given to :func:`add_config_flags`); ``required``: the command needs the flag
    (its help then shows no default); ``aliases``: more names the flag answers to."""

    name: str | None = None
    help: str | None = None
    type: Callable[[str], object] | None = None
    choices: tuple | None = None
    metavar: str | None = None
    group: str | None = None
    required: bool = False
    aliases: tuple[str, ...] = ()


def add_config_flags(
    groups: Mapping[str, argparse._ActionsContainer],
    config: type,
    group: str,
    flags: Mapping[str, Flag] | None = None,
    *,
    skip: Collection[str] = (),
    default: str | None = None,
    scaled: Collection[str] = (),
    prefix: str = "",
) -> None:
    """A flag for every field of dataclass ``config`` but those in ``skip``, each added to
    ``groups[flags[name].group]`` or else to ``groups[group]``; ``flags`` writes some fields' flags
    their own way. The help ends with the field's default in parentheses, or with ``default`` (as
    ``"the preset's"``) when given; a field in ``scaled`` says that ``--budget`` scales its default
    (:func:`budget_scaled`). Each flag's dest is ``prefix`` and the field's name (a nested config's
    fields, as ``"attention_options."``: :func:`given` with the same ``prefix`` reads them)."""
    flags = flags or {}
    hints = typing.get_type_hints(config)
    docs = field_docs(config)
    for field in dataclasses.fields(config):
        if field.name in skip or not field.init:
            continue
        flag = flags.get(field.name, Flag())
        default_text = default if default is not None else shown_default(field)
        if field.name in scaled:
            default_text += "; --budget scales it"
        if flag.help is None:
            doc = docs.get(field.name, "").replace("%", "%%")
            help = doc if flag.required else f"{doc} (%(shown_default)s)".lstrip()
        else:
            help = flag.help.replace("{default}", "%(shown_default)s")
        names = [f"--{name.replace('_', '-')}" for name in (flag.name, field.name, *flag.aliases) if name]
        named = flag.name or (field.name if prefix else None)  # not the dest's prefix
        switch = is_switch(hints[field.name])
        metavar = flag.metavar or (named.upper() if named and not flag.choices and not switch else None)
        options = dict(dest=prefix + field.name, help=help, metavar=metavar, required=flag.required)
        options["default"] = argparse.SUPPRESS
        target = groups[flag.group or group]
        if switch:
            action = target.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        else:
            parse = field_parser(hints[field.name], field.name, flag.type)
            action = target.add_argument(*names, type=parse, choices=flag.choices, **options)
        action.shown_default = default_text


def budget_scaled(config: type, budgets: Collection[float] = (0.1, 1.0, 2.0, 4.0)) -> set[str]:
    """The fields of dataclass ``config`` whose value its ``config.for_budget(budget)`` changes with
    the budget, tried at ``budgets`` (the smoke run, the default and larger runs), but ``budget``."""
    made = [config.for_budget(budget) for budget in budgets]
    return {
        field.name
        for field in dataclasses.fields(config)
        if field.name != "budget"
        and any(getattr(m, field.name) != getattr(made[0], field.name) for m in made)
    }


def add_study_flags(
    parser: argparse.ArgumentParser,
    config: type,
    flags: Mapping[str, Flag] | None = None,
    *,
    skip: Collection[str] = (),
    groups: Mapping[str, argparse._ActionsContainer] | None = None,
) -> None:
    """What a study command takes: ``--out``; ``--budget``, the argument of ``config.for_budget``
    (its default that method's); a flag for every field of ``config`` but ``budget`` and those in
    ``skip`` (:func:`add_config_flags`, into ``groups[""]`` or the parser), each whose default the
    budget changes saying so (:func:`budget_scaled`); ``--quiet``."""
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    budget = inspect.signature(config.for_budget).parameters["budget"].default
    steps = field_default(config, "steps")
    parser.add_argument(
        "--budget",
        type=positive_number,
        default=budget,
        help=f"training budget scale: 0.1 a smoke run (%(default)s: {steps} steps)",
    )
    groups = {"": parser, **(groups or {})}
    scaled = budget_scaled(config)
    add_config_flags(groups, config, "", flags, skip={"budget", *skip}, scaled=scaled)
    parser.add_argument("--quiet", action="store_true", help="no progress bars")


def budget_config(args: argparse.Namespace, config: type, skip: Collection[str] = ()):
    """``config.for_budget(args.budget)`` with every field the command line gave set as given."""
    return dataclasses.replace(config.for_budget(args.budget), **given(args, config, {"budget", *skip}))


def help_text(action: argparse.Action) -> str:
    """``action``'s help as ``--help`` shows it: its ``%(default)s`` and ``%(shown_default)s`` filled."""
    return argparse.HelpFormatter("priorattn")._expand_help(action) if action.help else ""


def given(args: argparse.Namespace, config: type, skip: Collection[str] = (), prefix: str = "") -> dict:
    """The fields of dataclass ``config`` (but those in ``skip``) whose flag the command line gave,
    with the values given (each flag's dest ``prefix`` and the field's name)."""
    return {
        field.name: getattr(args, prefix + field.name)
        for field in dataclasses.fields(config)
        if field.name not in skip and hasattr(args, prefix + field.name)
    }


def is_switch(annotation: object) -> bool:
    """Whether a field of ``annotation`` is a switch: ``bool`` or ``bool | None``."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) in UNIONS else (annotation,)
    return bool in members and set(members) <= {bool, type(None)}


def field_parser(
    annotation: object, name: str, own: Callable[[str], object] | None
) -> Callable[[str], object]:
    """An argparse ``type`` for a field of ``annotation``: ``own`` (a command's), reading ``none``
    as ``None`` too where the field may be ``None``, or else :func:`value_parser`'s."""
    if own is None:
        return value_parser(annotation, name)
    members = typing.get_args(annotation) if typing.get_origin(annotation) in UNIONS else ()
    return union_parser([own], none=True) if type(None) in members and str not in members else own


def value_parser(annotation: object, name: str) -> Callable[[str], object]:
    """An argparse ``type`` reading a value of ``annotation``: ``int``, ``float``, ``str``;
    ``tuple[T, ...]``, ``tuple[T, U]`` and ``list[T]`` as comma-separated values; a union as its first member
    that reads the text (``str`` last, so ``str | float`` reads ``1.5`` as a number, and
    ``str | dict`` any text as the ``str``), and ``none`` as ``None`` where the union allows it
    (but for a ``str``, whose text may be ``none``)."""
    if annotation in SCALARS:
        return SCALARS[annotation]
    members = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple:
        return tuple_parser(members, name)
    if typing.get_origin(annotation) is list:
        parse_tuple = tuple_parser((members[0], Ellipsis), name)
        return lambda text: list(parse_tuple(text))
    if typing.get_origin(annotation) in UNIONS:
        parsers = {}
        for member in sorted((m for m in members if m is not type(None)), key=lambda m: m is str):
            with contextlib.suppress(TypeError):  # a member no flag reads, as a spec's dict form
                parsers[member] = value_parser(member, name)
        if parsers:
            return union_parser(list(parsers.values()), type(None) in members and str not in parsers)
    raise TypeError(f"config field {name} has type {annotation}, which no flag reads")


def tuple_parser(members: tuple, name: str) -> Callable[[str], tuple]:
    """Comma-separated values of ``tuple[T, ...]`` (any number) or ``tuple[T, U, ...]`` (that many)."""
    if len(members) == 2 and members[1] is Ellipsis:
        parse_one = value_parser(members[0], name)

        def parse(text: str) -> tuple:
            return tuple(parse_one(part.strip()) for part in text.split(","))

        return parse
    parsers = [value_parser(member, name) for member in members]

    def parse_fixed(text: str) -> tuple:
        parts = text.split(",")
        if len(parts) != len(parsers):
            raise argparse.ArgumentTypeError(f"expected {len(parsers)} comma-separated values, got {text!r}")
        return tuple(parse_one(part.strip()) for parse_one, part in zip(parsers, parts))

    return parse_fixed


def union_parser(parsers: list[Callable[[str], object]], none: bool) -> Callable[[str], object]:
    """The first of ``parsers`` that reads the text; ``none`` reads ``"none"`` as ``None``."""

    def parse(text: str) -> object:
        if none and text.lower() == "none":
            return None
        for parse_one in parsers[:-1]:
            try:
                return parse_one(text)
            except (argparse.ArgumentTypeError, ValueError):
                pass
        return parsers[-1](text)

    return parse


def shown_default(field: dataclasses.Field) -> str:
    """A field's default as the help shows it (:func:`shown`), or ``required``."""
    if field.default is not dataclasses.MISSING:
        return shown(field.default)
    if field.default_factory is not dataclasses.MISSING:
        return shown(field.default_factory())
    return "required"


def field_default(config: type, name: str) -> str:
    """The default of field ``name`` of dataclass ``config`` as the help shows it."""
    return shown_default(next(field for field in dataclasses.fields(config) if field.name == name))


def shown(value: object) -> str:
    """A value as the help shows it: ``none``, ``on``/``off``, ``0.9,0.95`` (a tuple or list), ``3``."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple | list):
        return ",".join(map(str, value))
    return str(value)


def field_docs(config: type) -> dict[str, str]:
    """Each field's text in ``config``'s docstring, as plain text: the body of the bullet
    ``- ``name``: text`` where one names it alone, else the whole bullet whose head names it among
    others, as ``- ``log_every``, ``eval_every``: text``, else one whose head has a pattern that it
    matches, as ``- ``goat_*``: text``. A subclass's bullets come first, then those of the
    dataclasses it extends (a field it does not document keeps its base's text)."""
    bases = [base for base in config.__mro__ if dataclasses.is_dataclass(base)]
    bullets = [bullet for base in bases for bullet in docstring_bullets(own_doc(base))]
    docs = {}
    for field in dataclasses.fields(config):
        named = [(names, head, body) for names, head, body in bullets if names_field(names, field.name)]
        named.sort(key=lambda bullet: (bullet[0] != [field.name], field.name not in bullet[0]))
        if named:
            names, head, body = named[0]
            docs[field.name] = plain(body if names == [field.name] else f"{head}: {body}")
    return docs


def own_doc(config: type) -> str:
    """``config``'s own docstring (not a base's, nor the ``Name(field, ...)`` a dataclass makes)."""
    doc = inspect.cleandoc(config.__dict__.get("__doc__") or "")
    return "" if doc.startswith(f"{config.__name__}(") else doc


def docstring_bullets(doc: str) -> list[tuple[list[str], str, str]]:
    """The bullets of a docstring that start with the fields they document, ``- ``a``, ``b``:
    text``, each as ``(["a", "b"], head, text)``; a bullet runs on over the indented lines below."""
    bullets: list[str] = []
    in_bullet = False
    for line in doc.splitlines():
        if line.startswith("- "):
            bullets.append(line[2:])
            in_bullet = True
        elif in_bullet and line.startswith("  "):
            bullets[-1] += " " + line.strip()
        else:
            in_bullet = False
    parsed = []
    for bullet in bullets:
        head = re.match(r"((?:``[\w*]+``(?:, | and )?)+): (.*)", bullet)
        if head:
            parsed.append((re.findall(r"``([\w*]+)``", head[1]), head[1], head[2]))
    return parsed


def names_field(names: list[str], name: str) -> bool:
    """Whether ``names`` (a bullet's head) has ``name`` or a pattern ``prefix_*`` that it matches."""
    return any(n == name or (n.endswith("_*") and name.startswith(n[:-1])) for n in names)


def plain(text: str) -> str:
    """reStructuredText as terminal text: ````x```` -> ``x``, ``:func:`~a.b``` -> ``b``."""
    text = re.sub(r":\w+:`~[\w.]*?(\w+)`", r"\1", text)
    text = re.sub(r":\w+:`([^`]+)`", r"\1", text)
    return re.sub(r"``([^`]+)``", r"\1", text)
