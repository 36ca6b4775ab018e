"""Options declared once, as dataclass fields, and everything derived from the declarations.

A command's options are the fields of a dataclass, each declared with :func:`option`: the field
gives the option's name, type and default; its metadata (an :class:`OptionSpec`) gives the
flag, help, constraints and markers. Fields are declared in groups, classes decorated with
:func:`option_group`, whose title is the argument group of ``--help``. From the declarations:

- :func:`options_of`: the :class:`Option` of each field, in field order;
- :func:`make_parser` and :func:`values_from_args`: the argparse parser and the field values of
  its parsed flags;
- :meth:`Option.check`, :func:`check_exclusive` and :func:`refuse_outside`: validation whose
  errors (:class:`~distmb.core.errors.InputError`) name the flag.

Nothing here knows which command it serves: ``distmb.config.train`` declares the options of
``python -m distmb.train``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import numbers
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, TypeVar

import numpy as np

from distmb.core.errors import InputError

__all__ = [
    "GROUP_MAIN",
    "Option",
    "OptionSpec",
    "check_exclusive",
    "exclusive_pairs",
    "flags_given",
    "groups_of",
    "make_parser",
    "option",
    "option_group",
    "options_of",
    "plain_value",
    "refuse_empty",
    "refuse_outside",
    "values_from_args",
]

#: Title of the parser's own argument group (argparse's, for options outside any group).
GROUP_MAIN = "options"

#: Key of the :class:`OptionSpec` in a field's metadata.
_SPEC = "distmb.option"

_Group = TypeVar("_Group", bound=type)


@dataclass(frozen=True)
class OptionSpec:
    """Everything an option declares beyond its name, type and default.

    Args:
        help: ``--help`` text.
        flag: the flag; ``None`` means ``--`` and the field name with dashes.
        group: title of the argument group (:data:`GROUP_MAIN`: the parser's own); set by
            :func:`option_group`.
        exclusive: options of one group with the same name here exclude each other.
        choices: the allowed values, checked by argparse (``invalid choice``).
        allowed: returns the allowed values; checked after parsing (an :class:`InputError`),
            so that they can be looked up lazily.
        min: lower bound (``None`` values always pass: they mean "the default").
        min_open: the lower bound itself is excluded (``> min`` instead of ``>= min``).
        max: upper bound.
        max_open: the upper bound itself is excluded.
        infinite_means: a ``float`` option accepts ``inf`` (``--x inf``), which means this
            (e.g. ``"no limit"``; say it in ``help`` too, as ``0 = none`` is said); by
            default a float must be finite (NaN never passes).
        inverted: a ``bool`` option whose flag turns it off (``--no-progress``).
        resume_must_match: a checkpoint can only be resumed with the same value (it shapes
            the model, the sampled batches or the cache's contents).
        resume_applied: a checkpoint may be resumed with another value, which is applied
            (over the optimizer state it overrides, for ``--lr`` and ``--weight-decay``) and
            logged. Options that are neither are run-time choices (paths, threads, epochs).
    """

    help: str
    flag: str | None = None
    group: str = GROUP_MAIN
    exclusive: str | None = None
    choices: tuple[str, ...] | None = None
    allowed: Callable[[], Sequence[str]] | None = None
    min: float | None = None
    min_open: bool = False
    max: float | None = None
    max_open: bool = False
    infinite_means: str | None = None
    inverted: bool = False
    resume_must_match: bool = False
    resume_applied: bool = False


def option(default: Any, help: str, **spec: Any) -> Any:
    """Declare a dataclass field as an option.

    Args:
        default: the default, in Python and on the command line.
        help: ``--help`` text.
        **spec: the other fields of :class:`OptionSpec` (``group`` comes from
            :func:`option_group`).

    Returns:
        a :func:`dataclasses.field` carrying the :class:`OptionSpec` in its metadata.
    """
    return field(default=default, metadata={_SPEC: OptionSpec(help=help, **spec)})


def option_group(title: str = GROUP_MAIN) -> Callable[[_Group], _Group]:
    """Class decorator: a keyword-only dataclass whose fields are options of the argument group
    ``title``.

    A command's configuration inherits from its groups; a dataclass takes its bases' fields in
    reverse order of the bases (the last base's fields first).

    Args:
        title: the argument group's title in ``--help`` (:data:`GROUP_MAIN`: the parser's own).
    """

    def declare(cls: _Group) -> _Group:
        for name in cls.__dict__.get("__annotations__", {}):
            declared = cls.__dict__.get(name)
            if isinstance(declared, dataclasses.Field) and _SPEC in declared.metadata:
                spec = dataclasses.replace(declared.metadata[_SPEC], group=title)
                setattr(cls, name, field(default=declared.default, metadata={_SPEC: spec}))
        return dataclass(kw_only=True)(cls)

    return declare


@dataclass(frozen=True)
class Option:
    """One option: a dataclass field and its :class:`OptionSpec`.

    Args:
        name: the field's name.
        type: the value's type without ``None``: ``bool``, ``int``, ``float``, ``str`` or
            ``tuple`` (of ``int``, comma-separated on the command line).
        nullable: ``None`` is a value (it means "the default described in the help").
        default: the field's default.
        spec: what the field declares beyond that.
    """

    name: str
    type: type
    nullable: bool
    default: Any
    spec: OptionSpec

    @property
    def flag(self) -> str:
        """The command-line flag, e.g. ``--batch-size``."""
        return self.spec.flag or "--" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        """The flag's attribute in argparse's namespace, e.g. ``no_progress``."""
        return self.flag[2:].replace("-", "_")

    @property
    def cli_default(self) -> Any:
        """The default as the parser holds it (a tuple ``(5, 10, 15)``: ``"5,10,15"``)."""
        if self.type is bool:
            return False
        if self.type is tuple:
            return ",".join(map(str, self.default))
        return self.default

    def allowed_values(self) -> Sequence[str] | None:
        """The allowed values (``choices`` or ``allowed``), ``None`` if unrestricted."""
        if self.spec.choices is not None:
            return self.spec.choices
        return self.spec.allowed() if self.spec.allowed is not None else None

    def add_to(self, container: argparse._ActionsContainer) -> None:
        """Add the flag to a parser, argument group or mutually exclusive group."""
        kwargs: dict[str, Any] = {"help": self.spec.help}
        if self.type is bool:
            kwargs["action"] = "store_true"
        else:
            if self.type in (int, float):
                kwargs["type"] = self.type
            kwargs["default"] = self.cli_default
            if self.spec.choices is not None:
                kwargs["choices"] = self.spec.choices
        container.add_argument(self.flag, **kwargs)

    def from_cli(self, value: Any) -> Any:
        """The field's value for the parsed ``value`` of the flag."""
        if self.spec.inverted:
            return not value
        if self.type is tuple and isinstance(value, str):
            try:
                return tuple(int(v) for v in value.split(","))
            except ValueError:
                raise InputError(
                    f"{self.flag} {value!r}: expected comma-separated integers"
                ) from None
        return value

    def check(self, value: Any) -> None:
        """Check ``value`` against the type and the constraints.

        Raises:
            InputError: naming the flag, the constraint and the value.
        """
        if value is None and self.nullable:
            return
        if not _is_a(value, self.type):
            raise InputError(f"{self.flag} must be {TYPE_NAMES[self.type]}, got {value!r}")
        allowed = self.allowed_values()
        if allowed is not None and value not in allowed:
            raise InputError(f"{self.flag} must be one of {', '.join(allowed)}, got {value!r}")
        bound = self.bound_text()
        if bound and not self._within_bounds(value):
            raise InputError(f"{self.flag} must be {bound}, got {value}")
        if self.type is float and not math.isfinite(value) and not self._infinity_allowed(value):
            raise InputError(f"{self.flag} must be a finite number, got {value}")
        if self.type is str:
            refuse_empty(self.flag, value)

    def _infinity_allowed(self, value: float) -> bool:
        """``value`` is ``inf`` and the option gives it a meaning (never NaN)."""
        return self.spec.infinite_means is not None and math.isinf(value)

    def bound_text(self) -> str:
        """``">= 1"``, ``"> 0"``, ``"in [0, 1)"``, or ``""`` without bounds."""
        lo, hi, spec = self.spec.min, self.spec.max, self.spec
        if lo is not None and hi is not None:
            return f"in {'(' if spec.min_open else '['}{lo}, {hi}{')' if spec.max_open else ']'}"
        if lo is not None:
            return f"{'>' if spec.min_open else '>='} {lo}"
        if hi is not None:
            return f"{'<' if spec.max_open else '<='} {hi}"
        return ""

    def _within_bounds(self, value: float) -> bool:
        # Written so that NaN fails every bound.
        spec = self.spec
        if spec.min is not None and not (value > spec.min if spec.min_open else value >= spec.min):
            return False
        return spec.max is None or bool(value < spec.max if spec.max_open else value <= spec.max)


#: The option types, and how an error message names each.
TYPE_NAMES: dict[type, str] = {
    bool: "true or false",
    int: "an integer",
    float: "a number",
    str: "a string",
    tuple: "a tuple of integers",
}


def refuse_empty(flag: str, value: str | None) -> None:
    """Refuse an empty string for ``flag``: a path or a spec that names nothing (``--results
    ''`` would otherwise mean "no results file", silently). ``None`` (not given) passes.

    Raises:
        InputError: ``"--results must not be empty (a path, or leave the flag out)"``.
    """
    if value is not None and value == "":
        raise InputError(f"{flag} must not be empty (give a value, or leave the flag out)")


def plain_value(value: Any) -> Any:
    """A numpy scalar as the Python value it holds (anything else unchanged)."""
    return value.item() if isinstance(value, np.generic) else value


def _is_a(value: Any, kind: type) -> bool:
    """Whether ``value`` fits an option of type ``kind`` (numpy integers count as ``int``)."""
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is int:
        return isinstance(value, numbers.Integral)
    if kind is float:
        return isinstance(value, numbers.Real)
    if kind is tuple:
        return isinstance(value, tuple) and all(_is_a(v, int) for v in value)
    return isinstance(value, kind)


def options_of(cls: type) -> tuple[Option, ...]:
    """The options declared by the dataclass ``cls``'s fields, in field order.

    Raises:
        TypeError: a field not declared with :func:`option`, of a type outside
            :data:`TYPE_NAMES`, or a ``bool`` option whose default is not off.
    """
    hints = typing.get_type_hints(cls)
    options = []
    for f in fields(cls):
        spec = f.metadata.get(_SPEC)
        if spec is None or f.default is MISSING:
            raise TypeError(f"{cls.__name__}.{f.name} is not declared with option()")
        kind, nullable = hints[f.name], False
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            members = [t for t in typing.get_args(kind) if t is not type(None)]
            kind, nullable = members[0], len(members) < len(typing.get_args(kind))
        kind = typing.get_origin(kind) or kind
        if kind not in TYPE_NAMES:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported option type {kind!r}")
        if kind is bool and f.default is not spec.inverted:
            raise TypeError(f"{cls.__name__}.{f.name}: a flag's default must be {spec.inverted}")
        options.append(Option(f.name, kind, nullable, f.default, spec))
    return tuple(options)


def groups_of(options: Sequence[Option]) -> dict[str, list[Option]]:
    """The options by group title: :data:`GROUP_MAIN` first, the others in order of first
    appearance (the order of ``--help``)."""
    groups: dict[str, list[Option]] = {GROUP_MAIN: []}
    for opt in options:
        groups.setdefault(opt.spec.group, []).append(opt)
    return groups


def exclusive_pairs(options: Sequence[Option]) -> list[tuple[Option, Option]]:
    """Every pair of options that exclude each other (same group and ``exclusive`` name)."""
    sets: dict[tuple[str, str], list[Option]] = {}
    for opt in options:
        if opt.spec.exclusive is not None:
            sets.setdefault((opt.spec.group, opt.spec.exclusive), []).append(opt)
    return [
        (a, b) for members in sets.values() for i, a in enumerate(members) for b in members[i + 1 :]
    ]


def make_parser(prog: str, description: str, options: Sequence[Option]) -> argparse.ArgumentParser:
    """An argparse parser with one flag per option, in argument groups by title, showing the
    defaults in ``--help``."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    for title, members in groups_of(options).items():
        group = parser if title == GROUP_MAIN else parser.add_argument_group(title)
        exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for opt in members:
            container: argparse._ActionsContainer = group
            if opt.spec.exclusive is not None:
                if opt.spec.exclusive not in exclusive:
                    exclusive[opt.spec.exclusive] = group.add_mutually_exclusive_group()
                container = exclusive[opt.spec.exclusive]
            opt.add_to(container)
    return parser


def values_from_args(options: Sequence[Option], args: argparse.Namespace) -> dict[str, Any]:
    """Each option's field value, by field name, from the namespace of :func:`make_parser`.

    Raises:
        InputError: a tuple flag whose text is not comma-separated integers.
    """
    return {opt.name: opt.from_cli(getattr(args, opt.dest)) for opt in options}


def flags_given(config: object, options: Sequence[Option]) -> list[str]:
    """The flags of those ``options`` whose value in ``config`` is not their default."""
    return [o.flag for o in options if getattr(config, o.name) != o.default]


def check_exclusive(config: object, options: Sequence[Option]) -> None:
    """Refuse two options that exclude each other, both given (not at their defaults).

    Raises:
        InputError: naming both flags.
    """
    for a, b in exclusive_pairs(options):
        if flags_given(config, (a, b)) == [a.flag, b.flag]:
            raise InputError(f"{a.flag} and {b.flag} exclude each other")


def refuse_outside(config: object, options: Sequence[Option], where: str) -> None:
    """Refuse any of ``options`` given (not at its default) in a run outside ``where``.

    Args:
        config: the configuration (a dataclass holding the options' fields).
        options: the options that apply only to ``where``.
        where: the runs they apply to, as the message names them (``"--lr-schedule step"``).

    Raises:
        InputError: ``"--a, --b apply only to <where>"``.
    """
    given = flags_given(config, options)
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise InputError(f"{', '.join(given)} {verb} only to {where}")
