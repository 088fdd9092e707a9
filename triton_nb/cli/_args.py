"""The argparse helpers the sub-commands share: how a flag's text is read (numbers, ports,
booleans in tritonserver's spellings, comma-separated lists), one-line errors, and the line a
deprecated spelling prints."""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any


def _int_at_least(minimum: int) -> Callable[[str], int]:
    """An argparse type: a whole number (``1_000`` too) of at least ``minimum``."""
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a number >= {minimum}, got {value}")
        return value

    return parse


positive_int = _int_at_least(1)
whole_number = _int_at_least(0)


def fraction_0_1(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a number between 0 and 1, got {value}")
    return value


_LIST_WHAT = {int: "whole numbers", float: "numbers"}


def comma_list(kind: type, *, minimum: float | None = None, unique: bool = False) -> Callable[[str], list]:
    """The one spelling of a list on every sub-command: comma-separated values (``1,8,64``), as
    perf_analyzer and Model Analyzer take them; ``minimum`` and ``unique`` say what else is refused."""
    what = _LIST_WHAT.get(kind, "values")

    def parse(text: str) -> list:
        try:
            values = [kind(part.strip()) for part in text.split(",")]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
        if not all(math.isfinite(v) for v in values):
            raise argparse.ArgumentTypeError(f"expected finite {what}, got {text!r}")
        if minimum is not None and (low := min(values)) < minimum:
            raise argparse.ArgumentTypeError(f"expected values >= {minimum}, got {low}")
        if unique and len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"repeated value in {text!r}")
        return values

    return parse


class SpacedListAlias(argparse.Action):
    """A list flag that took space-separated values before it took comma-separated ones
    (``--preferred-batch-size 8 16``): that spelling is still read, for a release, with a line on
    stderr giving the comma-separated one. Its ``type`` is a :func:`comma_list`."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="*", **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        flat = [value for group in values for value in group]
        if len(values) > 1:
            spaced = " ".join(",".join(map(str, group)) for group in values)
            print(f"{parser.prog}: {option_string} {spaced} is deprecated: use {option_string} "
                  f"{','.join(map(str, flat))}", file=sys.stderr, flush=True)
        setattr(namespace, self.dest, flat)


class CommandHelpFormatter(argparse.HelpFormatter):
    """argparse's help, but a :class:`SpacedListAlias` flag shows its one spelling (``N,...``), not
    the space-separated one that is kept for a release."""

    def _format_args(self, action: argparse.Action, default_metavar: str) -> str:
        if isinstance(action, SpacedListAlias):
            return self._metavar_formatter(action, default_metavar)(1)[0]
        return super()._format_args(action, default_metavar)


def deprecated_spelling(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    print(f"{parser.prog}: {old} is deprecated: use {new}", file=sys.stderr, flush=True)


def true_or_false(text: str) -> bool:
    """A boolean flag's value as tritonserver reads it: true, on or 1; false, off or 0 (any case)."""
    lowered = text.lower()
    if lowered in ("true", "on", "1"):
        return True
    if lowered in ("false", "off", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def verbosity_level(text: str) -> int:
    """``--log-verbose``: a level >= 0, or true (1) and false (0), as tritonserver reads it."""
    lowered = text.lower()
    if lowered in ("true", "false"):
        return int(lowered == "true")
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a verbosity level (0, 1...) or true/false, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a verbosity level >= 0, got {value}")
    return value




def any_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def any_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number 0..65535 (0 picks a free one), got {value}")
    return value


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Argument mistakes as one line on stderr (no usage block, which is long for these commands)."""

    def error(message: str):
        # a required flag whose deprecated spelling shares its group is named alone, as a required flag is
        message = re.sub(r"^one of the arguments (\S+) is required$", r"the following arguments are required: \1",
                         message)
        parser.exit(2, f"{parser.prog}: error: {message} (see {parser.prog} --help)\n")

    parser.error = error  # type: ignore[method-assign]
    return parser


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


@contextlib.contextmanager
def environment_set(values: dict[str, str]) -> Iterator[None]:
    """``values`` in the process environment while the block runs (the server reads the SageMaker
    variables when it is made), as they were before afterwards: ``main`` may run in a caller's process."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
