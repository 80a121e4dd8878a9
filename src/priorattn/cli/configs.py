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
switch ``--name`` / ``--no-name``.
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

from .parsing import integer, number

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
    (one of the groups given to :func:`add_config_flags`)."""

    name: str | None = None
    help: str | None = None
    type: Callable[[str], object] | None = None
    choices: tuple | None = None
    metavar: str | None = None
    group: str | None = None


def add_config_flags(
    groups: Mapping[str, argparse._ActionsContainer],
    config: type,
    group: str,
    flags: Mapping[str, Flag] | None = None,
    *,
    skip: Collection[str] = (),
    default: str | None = None,
) -> None:
    """A flag for every field of dataclass ``config`` but those in ``skip``, each added to
    ``groups[flags[name].group]`` or else to ``groups[group]``; ``flags`` writes some fields' flags
    their own way. The help ends with the field's default in parentheses, or with ``default`` (as
    ``"the preset's"``) when given."""
    flags = flags or {}
    hints = typing.get_type_hints(config)
    docs = field_docs(config)
    for field in dataclasses.fields(config):
        if field.name in skip or not field.init:
            continue
        flag = flags.get(field.name, Flag())
        shown = default if default is not None else shown_default(field)
        if flag.help is None:
            help = f"{docs.get(field.name, '').replace('%', '%%')} ({shown})".lstrip()
        else:
            help = flag.help.replace("{default}", shown)
        names = [f"--{name.replace('_', '-')}" for name in (flag.name, field.name) if name]
        metavar = flag.metavar or (flag.name.upper() if flag.name and not flag.choices else None)
        options = dict(dest=field.name, default=argparse.SUPPRESS, help=help, metavar=metavar)
        target = groups[flag.group or group]
        if is_switch(hints[field.name]):
            target.add_argument(*names, action=argparse.BooleanOptionalAction, **options)
        else:
            parse = field_parser(hints[field.name], field.name, flag.type)
            target.add_argument(*names, type=parse, choices=flag.choices, **options)


def given(args: argparse.Namespace, config: type, skip: Collection[str] = ()) -> dict:
    """The fields of dataclass ``config`` (but those in ``skip``) whose flag the command line gave,
    with the values given."""
    return {
        field.name: getattr(args, field.name)
        for field in dataclasses.fields(config)
        if field.name not in skip and hasattr(args, field.name)
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
    ``tuple[T, ...]`` and ``tuple[T, U]`` as comma-separated values; a union as its first member
    that reads the text (``str`` last, so ``str | float`` reads ``1.5`` as a number, and
    ``str | dict`` any text as the ``str``), and ``none`` as ``None`` where the union allows it
    (but for a ``str``, whose text may be ``none``)."""
    if annotation in SCALARS:
        return SCALARS[annotation]
    members = typing.get_args(annotation)
    if typing.get_origin(annotation) is tuple:
        return tuple_parser(members, name)
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
    """A field's default as the help shows it: ``none``, ``on``/``off``, ``0.9,0.95``, ``3``."""
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "required"
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def field_docs(config: type) -> dict[str, str]:
    """Each field's text in ``config``'s docstring, as plain text: the body of the bullet
    ``- ``name``: text`` where one names it alone, else the whole bullet whose head names it among
    others, as ``- ``log_every``, ``eval_every``: text`` or a pattern ``- ``goat_*``: text``."""
    bullets = docstring_bullets(inspect.getdoc(config) or "")
    docs = {}
    for field in dataclasses.fields(config):
        named = [(names, head, body) for names, head, body in bullets if names_field(names, field.name)]
        alone = [body for names, head, body in named if names == [field.name]]
        if alone or named:
            docs[field.name] = plain(alone[0] if alone else f"{named[0][1]}: {named[0][2]}")
    return docs


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
