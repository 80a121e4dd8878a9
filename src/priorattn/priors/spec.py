"""Prior specs: a prior, or a sum of priors, written as plain data, and built from it.

A spec is any of

- a string: ``"goat"``, ``"goat(num_freqs=4, slope=none)+alibi"``, ``"ggd(trainable=[alpha, mu])"``:
  registered names joined by ``+`` (a sum), each with options in parentheses. Values are
  ``true``/``false``, numbers, words (a string needs double quotes only where it is not a word) and
  lists in brackets;
- a dict ``{"name": "goat", "num_freqs": 4, "slope": "none"}``: one prior (JSON's, a saved config's);
- a list of specs: their sum (:class:`~priorattn.priors.Sum`), so a list may hold a sum of its own.

An option's value is read as its registered type. An option of words may read ``true`` and
``false`` (a string's or a dict's) as two of its words (:class:`~priorattn.priors.Choice`: GOAT's
``sink`` and ``slope``, which switch on and off), and the spec then holds the word:
``canonical_spec("goat(slope=false)")`` is ``"goat(slope=none)"``.

``prior.spec()`` gives the dict of a registered prior with every option (a list for a sum), and
:func:`build_prior` builds the same prior from it.
"""

from __future__ import annotations

import json
import re

from .base import Prior
from .registry import CONTEXT, Registered, registered
from .sum import Sum

TOKEN = re.compile(
    r"\s*(?:(?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)"
    r"|(?P<word>[A-Za-z_]\w*)"
    r"|(?P<quoted>\"(?:[^\"\\]|\\.)*\")"
    r"|(?P<mark>[()\[\],=+]))"
)
WORD = re.compile(r"[A-Za-z_]\w*")


def read_spec(spec) -> dict | list:
    """``spec`` (a string, dict or list; see the module) as plain data with typed options: a dict
    ``{"name": ..., option: value}`` holding the options given, or a list of such for a sum.
    A ValueError names an unknown prior or option, or a bad value, and lists the valid ones."""
    if isinstance(spec, str):
        terms = _parse(spec)
        return terms[0] if len(terms) == 1 else terms
    if isinstance(spec, dict):
        if not isinstance(spec.get("name"), str):
            raise ValueError(f"a prior spec dict needs a 'name' (a registered prior), got {spec!r}")
        entry = registered(spec["name"])
        return dict(name=entry.name) | {
            key: entry.option(key).value(value, entry.name) for key, value in spec.items() if key != "name"
        }
    if isinstance(spec, list | tuple) and spec:
        return [read_spec(part) for part in spec]
    raise ValueError(f"a prior spec is a string, a dict or a non-empty list of specs, got {spec!r}")


def canonical_spec(spec) -> str:
    """The one string of ``spec``: its priors with the options given that differ from their
    defaults (those a model fills are kept wherever given), values written alike. Equal priors give
    equal strings. A list of one prior is that prior; a sum inside a sum has no string and is
    refused."""
    data = read_spec(spec)
    terms = data if isinstance(data, list) else [data]
    if any(isinstance(term, list) for term in terms):
        raise ValueError(f"a sum inside a sum has no spec string: give it as a list, got {spec!r}")
    return "+".join(_format_term(term) for term in terms)


def with_defaults(spec, **by_prior: dict) -> dict | list:
    """``spec`` (read as :func:`read_spec`) with ``by_prior[name]``'s options set on every ``name``
    prior in it that does not give them: ``with_defaults("alibi+goat", goat=dict(num_freqs=3))``."""

    defaults = {name: read_spec(dict(name=name, **options)) for name, options in by_prior.items()}

    def completed(data):
        if isinstance(data, list):
            return [completed(part) for part in data]
        return defaults.get(data["name"], {}) | data

    return completed(read_spec(spec))


def build_prior(spec, num_heads: int, **context) -> Prior:
    """The prior ``spec`` describes, for ``num_heads`` heads; a list or ``+`` builds a
    :class:`~priorattn.priors.Sum` of its parts, in order.

    ``context``: what the model supplies (:data:`~priorattn.priors.registry.CONTEXT`): ``train_len``
    (its training length) and ``init`` (``"uniform"`` or ``"alibi"``, where it starts its learnable
    priors). They fill the options declared ``FromModel`` that the spec leaves out; a spec's own
    option wins. A constructor's refusal is re-raised with the prior's name in front."""
    unknown = sorted(set(context) - set(CONTEXT))
    if unknown:
        raise TypeError(f"build_prior got unknown context {unknown}: a model supplies {list(CONTEXT)}")
    return _build(read_spec(spec), num_heads, {k: v for k, v in context.items() if v is not None})


def _build(data, num_heads: int, context: dict) -> Prior:
    if isinstance(data, list):
        return Sum(*(_build(part, num_heads, context) for part in data))
    entry = registered(data["name"])
    kwargs = {key: value for key, value in data.items() if key != "name"}
    for option in entry.options.values():
        model = option.from_model
        if option.name in kwargs or model is None or model.key not in context:
            continue
        value = context[model.key]
        if model.values is not None:
            if value not in model.values:
                known = list(model.values)
                raise ValueError(
                    f"prior {entry.name!r}: the model's {model.key} must be one of {known}, got {value!r}"
                )
            value = model.values[value]
        kwargs[option.name] = option.value(value, entry.name)
    args = (num_heads,) if entry.takes_heads else ()
    try:
        return entry.cls(*args, **kwargs)
    except (ValueError, TypeError) as error:
        raise type(error)(f"prior {entry.name!r}: {error}") from error


def _format_term(term: dict) -> str:
    entry = registered(term["name"])
    given = [
        f"{key}={_format_value(term[key])}"
        for key, option in entry.options.items()  # in the constructor's order
        if key in term and (term[key] != option.default or option.from_model)
    ]
    return entry.name + (f"({', '.join(given)})" if given else "")


def _format_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(_format_value(v) for v in value) + "]"
    if isinstance(value, str):
        plain = WORD.fullmatch(value) and value.lower() not in ("true", "false")
        return value if plain else json.dumps(value)
    return repr(value)  # an int, or a float that float() reads back (inf and nan are words)


def _parse(text: str) -> list[dict]:
    """The terms of a spec string, each read against its registration."""
    tokens, position = [], 0
    while text[position:].strip():
        match = TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"cannot read prior spec {text!r}: unexpected {text[position:].strip()[0]!r}")
        kind = match.lastgroup
        token = match.group(kind)
        if kind == "quoted":
            token = json.loads(token)
        tokens.append((kind, token, match.start(kind)))
        position = match.end()
    tokens.append(("end", "", len(text)))
    reader = _Reader(text, tokens)
    terms = [reader.term()]
    while reader.take("mark", "+"):
        terms.append(reader.term())
    reader.expect("end", "", "'+' or the end")
    return terms


class _Reader:
    """Recursive descent over the tokens of one spec string (grammar in the module docstring)."""

    def __init__(self, text: str, tokens: list[tuple[str, str, int]]):
        self.text, self.tokens, self.i = text, tokens, 0

    def take(self, kind: str, token: str | None = None):
        found_kind, found, _ = self.tokens[self.i]
        if found_kind == kind and (token is None or found == token):
            self.i += 1
            return found if token is None else True
        return None

    def expect(self, kind: str, token: str | None, what: str):
        found = self.take(kind, token)
        if found is None:
            _, got, at = self.tokens[self.i]
            got = repr(got) if got else "the end"
            raise ValueError(
                f"cannot read prior spec {self.text!r}: expected {what} at character {at}, got {got}"
            )
        return found

    def term(self) -> dict:
        entry: Registered = registered(self.expect("word", None, "a prior's name"))
        term = dict(name=entry.name)
        if self.take("mark", "("):
            while not self.take("mark", ")"):
                if len(term) > 1:
                    self.expect("mark", ",", "',' or ')'")
                key = self.expect("word", None, "an option's name")
                option = entry.option(key)
                if key in term:
                    raise ValueError(f"prior {entry.name!r}: option {key} is given twice in {self.text!r}")
                self.expect("mark", "=", f"'=' after {key}")
                term[key] = option.value(self.value(), entry.name, text=True)
        return term

    def value(self) -> str | list[str]:
        if self.take("mark", "["):
            words = []
            while not self.take("mark", "]"):
                if words:
                    self.expect("mark", ",", "',' or ']'")
                words.append(self.scalar())
            return words
        return self.scalar()

    def scalar(self) -> str:
        for kind in ("number", "word", "quoted"):
            found = self.take(kind)
            if found is not None:
                return found
        return self.expect("word", None, "a value")
