"""The priors by name, and the options each one takes.

A prior file registers its class once, after defining it, naming the constructor arguments that are
its options with one line of documentation each:

    register("alibi", ALiBi)
    register("ggd", GGD, init=FromModel("...", "init"), trainable="...", eps="...")
    register("goat", GOAT, slope=Choice("...", ("learned", "fixed", "none"), {True: "learned", ...}))

An option's type and default are its constructor argument's annotation and default (one source:
the signature); the types a spec can carry are ``bool``, ``int``, ``float``, ``str`` and
``tuple[str, ...]``. A string option declared :class:`Choice` takes one of its words, and may read
``true``/``false`` as two of them. A constructor argument that is not an option must be state that a
checkpoint holds (ALiBi's ``slopes``, a buffer). The constructor's ``num_heads``, where it has one,
is the model's head count. An option declared :class:`FromModel` is filled by the model a prior is built
for (:data:`CONTEXT`) where a spec leaves it out.

A prior built from a registered class remembers the arguments it was made with
(:class:`~priorattn.priors.Prior`), so it describes itself: :func:`spec_of`.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Mapping
from dataclasses import dataclass

from .. import registry

#: What a model may supply to the priors it builds (``build_prior(spec, num_heads, **context)``).
CONTEXT = {
    "train_len": "the length the model trains at (GPTConfig.seq_len; add_prior's seq_len)",
    "init": "where the model starts its learnable priors: 'uniform' or 'alibi' (GPTConfig.prior_init)",
}

#: The option types a spec carries: plain data, as JSON and the spec grammar write it.
KINDS = (bool, int, float, str, tuple[str, ...])


@dataclass(frozen=True)
class FromModel:
    """An option that the model fills where a spec leaves it out: with its context value ``key``
    (:data:`CONTEXT`), translated through ``values`` where given (a prior whose words for its starts
    are not the model's)."""

    doc: str
    key: str
    values: Mapping[str, object] | None = None


@dataclass(frozen=True)
class Choice:
    """A string option that takes one of ``words``. ``booleans`` reads ``true`` and ``false`` as
    words (an on/off option with several kinds of on, as GOAT's ``slope``: a spec or saved config with
    ``slope=false`` means ``slope=none``), so a spec's canonical string names the word."""

    doc: str
    words: tuple[str, ...]
    booleans: Mapping[bool, str] | None = None


@dataclass(frozen=True)
class Option:
    """One option of a registered prior: a keyword argument of its constructor."""

    name: str
    kind: object  # one of KINDS
    default: object
    doc: str
    from_model: FromModel | None = None
    choice: Choice | None = None

    def value(self, value, prior: str, text: bool = False):
        """``value`` as this option's type: from Python data, or with ``text`` from the words of a
        spec string (a list of them for a tuple); a ValueError naming the prior and option else."""
        kind, ok = self.kind, None
        if kind is bool:
            if text and isinstance(value, str) and value.lower() in ("true", "false"):
                ok = value.lower() == "true"
            elif isinstance(value, bool):
                ok = value
        elif kind is int:
            if text and isinstance(value, str) and value.lstrip("+-").isdigit():
                ok = int(value)
            elif isinstance(value, int) and not isinstance(value, bool):
                ok = value
        elif kind is float:
            if text and isinstance(value, str):
                try:
                    ok = float(value)
                except ValueError:
                    ok = None
            elif isinstance(value, int | float) and not isinstance(value, bool):
                ok = float(value)
        elif kind is str:
            booleans = None if self.choice is None else self.choice.booleans
            if booleans and (isinstance(value, bool) or text and str(value).lower() in ("true", "false")):
                ok = booleans[value if isinstance(value, bool) else value.lower() == "true"]
            elif isinstance(value, str) and (self.choice is None or value in self.choice.words):
                ok = value
        else:  # tuple[str, ...]; a spec string may give one word for a tuple of one
            words = [value] if text and isinstance(value, str) else value
            if isinstance(words, list | tuple) and all(isinstance(w, str) for w in words):
                ok = tuple(words)
        if ok is None:
            raise ValueError(f"prior {prior!r}: option {self.name} must be {self.expects()}, got {value!r}")
        return ok

    def expects(self) -> str:
        """The type in words, for messages and listings."""
        if self.choice is not None:
            booleans = self.choice.booleans
            read = f" (true: {booleans[True]}, false: {booleans[False]})" if booleans else ""
            return f"one of {', '.join(self.choice.words)}{read}"
        return {bool: "true or false", int: "an int", float: "a number", str: "a string"}.get(
            self.kind, "a list of strings"
        )


@dataclass(frozen=True)
class Registered:
    """A registered prior: its name, class and options (in constructor order)."""

    name: str
    cls: type
    options: dict[str, Option]
    takes_heads: bool

    def option(self, name: str) -> Option:
        if name not in self.options:
            known = ", ".join(self.options) or "none"
            raise ValueError(f"prior {self.name!r} has no option {name!r}: its options are {known}")
        return self.options[name]


class UnregisteredPrior(TypeError):
    """A prior whose class is not registered cannot describe itself (:func:`spec_of`)."""


#: Each registered class's registration, for :func:`spec_of`; by name they are the ``"prior"`` kind of
#: :mod:`priorattn.registry`.
_BY_CLASS: dict[type, Registered] = {}


def register(name: str, cls: type, /, **options: str | FromModel | Choice) -> type:
    """Make ``cls`` buildable as ``name`` in a spec, with the constructor arguments named in
    ``options`` (each a one-line doc, :class:`FromModel` or :class:`Choice`) as its options; returns
    ``cls``.

    Registering the same class under the same name again does nothing; another class under a taken
    name, or a class under a second name, is refused."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"a prior's name must be an identifier, got {name!r}")
    by_name = registry.entries("prior")
    if name in by_name or cls in _BY_CLASS:
        if by_name.get(name) is _BY_CLASS.get(cls):
            return cls
        why = (
            f"the name is {by_name[name].cls.__name__}'s"
            if name in by_name
            else f"it is {_BY_CLASS[cls].name!r}"
        )
        raise ValueError(f"cannot register {cls.__name__} as prior {name!r}: {why}")
    parameters = inspect.signature(cls.__init__).parameters
    hints = typing.get_type_hints(cls.__init__)
    declared = {}
    for option, doc in options.items():
        parameter = parameters.get(option)
        if parameter is None or parameter.default is inspect.Parameter.empty:
            raise TypeError(
                f"{cls.__name__} has no keyword argument {option!r} with a default to be an option"
            )
        if hints.get(option) not in KINDS:
            raise TypeError(
                f"option {option!r} of {cls.__name__} is annotated {hints.get(option)!r}: a spec carries "
                "bool, int, float, str or tuple[str, ...]"
            )
        model = doc if isinstance(doc, FromModel) else None
        if model is not None and model.key not in CONTEXT:
            raise ValueError(f"FromModel key must be one of {list(CONTEXT)}, got {model.key!r}")
        kind = hints[option]
        choice = doc if isinstance(doc, Choice) else None
        if choice is not None:
            booleans = {} if choice.booleans is None else dict(choice.booleans)
            if (
                kind is not str
                or (booleans and set(booleans) != {True, False})
                or any(word not in choice.words for word in [parameter.default, *booleans.values()])
            ):
                raise TypeError(
                    f"option {option!r} of {cls.__name__} is a Choice of {list(choice.words)}: it must be "
                    "annotated str, its default one of them, and its booleans read both true and false "
                    "as words of them"
                )
        declared[option] = Option(
            option, kind, parameter.default, doc if isinstance(doc, str) else doc.doc, model, choice
        )
    entry = Registered(name, cls, declared, "num_heads" in parameters)
    registry.register("prior", name, entry)
    _BY_CLASS[cls] = entry
    return cls


def names() -> tuple[str, ...]:
    """The registered priors' names, sorted."""
    return tuple(sorted(registry.names("prior")))


def registered(name: str) -> Registered:
    """The registration of ``name``; a ValueError listing the registered names (and saying what
    ``name`` is where it names another kind of :mod:`priorattn.registry`, as ``"bam"``, a model) else."""
    by_name = registry.entries("prior")
    if name not in by_name:
        raise ValueError(
            f"unknown prior {name!r}: use one of {', '.join(names())}{registry.elsewhere(name, 'prior')}"
        )
    return by_name[name]


def options(name: str) -> dict[str, Option]:
    """The options of prior ``name``: type, default, doc, and whether a model fills it."""
    return dict(registered(name).options)


def spec_of(prior) -> dict:
    """``{"name": ..., option: value, ...}``: every option of ``prior``'s registration, valued as
    it was made (the arguments :class:`~priorattn.priors.Prior` recorded), as plain data."""
    entry = _BY_CLASS.get(type(prior))
    if entry is None:
        raise UnregisteredPrior(
            f"{type(prior).__name__} is not a registered prior, so it cannot describe itself: "
            "register it (priorattn.priors.register)"
        )
    args, kwargs = prior.made_with
    bound = inspect.signature(entry.cls.__init__).bind(None, *args, **kwargs)
    bound.apply_defaults()
    spec = dict(name=entry.name)
    for option in entry.options.values():
        value = option.value(bound.arguments[option.name], entry.name)
        spec[option.name] = list(value) if isinstance(value, tuple) else value
    return spec
