"""Option groups of a measurement, shared by :func:`~triton_nb.perf.measure`, :func:`~triton_nb.perf.tune`,
``triton-nb perf``/``tune``, ``%triton_perf`` and the tuning panel.

Each group is a frozen dataclass (as :class:`~triton_nb.ServerSettings` is for the server) that checks
its values when made, so a bad one is refused with the field's name and the allowed values before any
connection is opened:

* :class:`Wire` — how requests travel: tensor formats and compression (perf_analyzer's
  ``--input-tensor-format``, ``--output-tensor-format``, tritonclient's request and response
  compression, ``--grpc-compression-algorithm``);
* :class:`Sequences` — the sequences a stateful model is measured with (``--sequence-length``,
  ``--sequence-length-variation``, ``--sequence-id-range``, ``--num-of-sequences``);
* :class:`SharedMemory` — tensors in shared-memory regions instead of the requests
  (``--shared-memory``, ``--output-shared-memory-size``).

The allowed values (:data:`TENSOR_FORMATS`, :data:`COMPRESSIONS`, :data:`SHARED_MEMORY_KINDS`) are
spelled here once; the command line, the magics and the checks import them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from triton_nb._deprecation import warn_deprecated
from triton_nb.errors import InvalidArgumentError

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_OUTPUT_SHARED_MEMORY_SIZE",
    "SHARED_MEMORY_KINDS",
    "TENSOR_FORMATS",
    "Sequences",
    "SharedMemory",
    "Wire",
    "flat_options",
    "parse_sequence_id_range",
    "wire_of",
]

#: perf_analyzer's ``--input-tensor-format`` / ``--output-tensor-format`` values (HTTP).
TENSOR_FORMATS = ("binary", "json")
#: tritonclient's request and response compression algorithms (HTTP), and perf_analyzer's
#: ``--grpc-compression-algorithm`` values ("none" and the two gRPC offers).
COMPRESSIONS = ("none", "gzip", "deflate")
#: perf_analyzer's ``--shared-memory`` choices.
SHARED_MEMORY_KINDS = ("none", "system", "cuda")
#: perf_analyzer's ``--output-shared-memory-size`` default: the bytes per row of an output whose
#: size the config does not give (BYTES, or a variable dimension).
DEFAULT_OUTPUT_SHARED_MEMORY_SIZE = 102400


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Wire:
    """How a network load's requests travel (HTTP and gRPC; the server is not touched).

    ``input_tensor_format``/``output_tensor_format``: "binary" (the binary tensor data extension)
    or "json" (tensors as JSON ``data`` lists), HTTP. ``request_compression``/``response_compression``:
    "none", "gzip" or "deflate", HTTP bodies. ``grpc_compression_algorithm``: the same for gRPC
    messages."""

    input_tensor_format: str = "binary"
    output_tensor_format: str = "binary"
    request_compression: str = "none"
    response_compression: str = "none"
    grpc_compression_algorithm: str = "none"

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            choices = TENSOR_FORMATS if field.name.endswith("tensor_format") else COMPRESSIONS
            if value not in choices:
                raise InvalidArgumentError(f"{field.name} ({_flag(field.name)}) must be one of {', '.join(choices)}, "
                                           f"got {value!r}")

    def as_dict(self) -> dict[str, str]:
        """Every field by name (the columns a measurement reports them in)."""
        return dataclasses.asdict(self)

    def loadgen_arguments(self) -> list[str]:
        """The load generator's command-line arguments for the compression (the tensor formats
        are in the bodies it is given)."""
        return ["--request-compression", self.request_compression, "--response-compression",
                self.response_compression, "--grpc-compression", self.grpc_compression_algorithm]


def parse_sequence_id_range(value: str | Sequence[int | None] | int | None) -> tuple[int, int | None]:
    """perf_analyzer's ``--sequence-id-range`` ``start[:end]``: the first id and the end (excluded;
    None: unbounded). Also a ``(start, end)`` tuple or a single start. Default ``(1, None)``."""
    if value is None:
        return 1, None
    if isinstance(value, str):
        parts = value.split(":")
        try:
            numbers: list[int | None] = [int(part) for part in parts]
        except ValueError:
            numbers = []
    elif _whole(value):
        numbers = [value]  # type: ignore[list-item]
    else:
        numbers = list(value)  # type: ignore[arg-type]
    valid = (1 <= len(numbers) <= 2 and _whole(numbers[0])
             and (len(numbers) == 1 or numbers[1] is None or _whole(numbers[1])))
    if not valid:
        raise InvalidArgumentError(f"sequence_id_range must be start[:end] (whole numbers), got {value!r}")
    start = numbers[0]
    end = numbers[1] if len(numbers) == 2 else None
    assert start is not None
    if start < 1:
        raise InvalidArgumentError(f"sequence_id_range must start at 1 or more (sequence id 0 means no sequence), "
                                   f"got {value!r}")
    if end is not None and end <= start:
        raise InvalidArgumentError(f"sequence_id_range {value!r}: the end is excluded and must be above the start")
    return start, end


@dataclass(frozen=True)
class Sequences:
    """The sequences a stateful model is measured with, as perf_analyzer's sequence options.

    ``sequence_length`` (``--sequence-length``): requests per sequence (None: 20 for a model with
    ``sequence_batching``, and no sequences for another); each sequence's length is drawn within
    ``sequence_length_variation`` percent of it (``--sequence-length-variation``).
    ``sequence_id_range`` (``--sequence-id-range``): ``"start[:end]"`` or ``(start, end)``, the
    ids new sequences take in turn, ``end`` excluded. ``num_of_sequences`` (``--num-of-sequences``):
    the sequences active at once under a request rate."""

    sequence_length: int | None = None
    sequence_length_variation: float = 20.0
    sequence_id_range: str | tuple[int, int | None] | int | None = None
    num_of_sequences: int = 4

    def __post_init__(self) -> None:
        length = self.sequence_length
        if length is not None and (not _whole(length) or length < 1):
            raise InvalidArgumentError(f"sequence_length must be a whole number >= 1, got {length!r}")
        variation = self.sequence_length_variation
        if isinstance(variation, bool) or not (isinstance(variation, (int, float)) and math.isfinite(variation)
                                               and variation >= 0):
            raise InvalidArgumentError(f"sequence_length_variation must be a percentage >= 0, got {variation!r}")
        if not _whole(self.num_of_sequences) or self.num_of_sequences < 1:
            raise InvalidArgumentError(f"num_of_sequences must be a whole number >= 1, got {self.num_of_sequences!r}")
        parse_sequence_id_range(self.sequence_id_range)

    @property
    def id_range(self) -> tuple[int, int | None]:
        """``sequence_id_range`` read: the first id and the end (excluded; None: unbounded)."""
        return parse_sequence_id_range(self.sequence_id_range)


@dataclass(frozen=True)
class SharedMemory:
    """Tensors in shared-memory regions instead of the requests, as perf_analyzer's
    ``--shared-memory``: ``kind`` "none", or "system" (over HTTP or gRPC, to a server on this
    host; "cuda" is refused by :func:`~triton_nb.perf.measure`: it needs a GPU).
    ``output_size_bytes`` (``--output-shared-memory-size``): the bytes per row of an output whose
    size the config does not give (BYTES or a variable dimension)."""

    kind: str = "none"
    output_size_bytes: int = DEFAULT_OUTPUT_SHARED_MEMORY_SIZE

    def __post_init__(self) -> None:
        if self.kind not in SHARED_MEMORY_KINDS:
            raise InvalidArgumentError(f"shared_memory must be one of {', '.join(SHARED_MEMORY_KINDS)}, "
                                       f"got {self.kind!r}")
        if not _whole(self.output_size_bytes) or self.output_size_bytes < 1:
            raise InvalidArgumentError(f"output_size_bytes (--output-shared-memory-size) must be a whole number of "
                                       f"bytes >= 1, got {self.output_size_bytes!r}")

    @classmethod
    def of(cls, value: SharedMemory | str | None) -> SharedMemory:
        """A group from what a ``shared_memory=`` argument takes: the group, or its kind alone."""
        if value is None:
            return cls()
        if isinstance(value, SharedMemory):
            return value
        if isinstance(value, str):
            return cls(kind=value)
        raise InvalidArgumentError(f"shared_memory must be a SharedMemory or one of "
                                   f"{', '.join(SHARED_MEMORY_KINDS)}, got {type(value).__name__}")


# The flat keywords measure() took before the groups, and where each now lives.
_FLAT = {
    **{field.name: ("wire", Wire, field.name) for field in dataclasses.fields(Wire)},
    **{field.name: ("sequences", Sequences, field.name) for field in dataclasses.fields(Sequences)},
    "output_shared_memory_size": ("shared_memory", SharedMemory, "output_size_bytes"),
}


def flat_options(where: str, options: MutableMapping[str, Any], wire: Wire | Mapping[str, str] | None,
                 sequences: Sequences | None,
                 shared_memory: SharedMemory | str | None, *, stacklevel: int = 4
                 ) -> tuple[Wire, Sequences, SharedMemory]:
    """The three groups of a call, with the deprecated flat keywords in ``options`` (taken out of
    it) folded into them, each group's with one warning naming the group to pass instead. A flat
    keyword beside its group is an error, naming both."""
    given: dict[str, dict[str, Any]] = {}
    for name in [name for name in options if name in _FLAT]:
        group, _, field = _FLAT[name]
        given.setdefault(group, {})[field] = options.pop(name)
    groups: dict[str, Any] = {"wire": wire, "sequences": sequences, "shared_memory": shared_memory}
    for group, fields in given.items():
        kind = {"wire": Wire, "sequences": Sequences, "shared_memory": SharedMemory}[group]
        flat = [name for name, (g, _, field) in _FLAT.items() if g == group and field in fields]
        # shared_memory="system" (the kind alone) is not a group given: its size may come beside it
        if groups[group] is not None and not isinstance(groups[group], str):
            raise InvalidArgumentError(f"{where}: give {group}= or {', '.join(flat)}, not both")
        base = SharedMemory.of(shared_memory) if group == "shared_memory" else kind()
        spelled = ", ".join(f"{field}={value!r}" for field, value in fields.items())
        warn_deprecated(f"{where}({', '.join(f'{n}=' for n in flat)}) is deprecated: pass "
                        f"{group}={kind.__name__}({spelled})", stacklevel=stacklevel)
        groups[group] = dataclasses.replace(base, **fields)
    sequences = groups["sequences"]
    if sequences is not None and not isinstance(sequences, Sequences):
        raise InvalidArgumentError(f"sequences must be a Sequences, got {type(sequences).__name__}")
    return wire_of(groups["wire"]), sequences or Sequences(), SharedMemory.of(groups["shared_memory"])


def wire_of(value: Wire | Mapping[str, str] | None) -> Wire:
    """A :class:`Wire` from a ``wire=`` argument: the group, or a mapping of some of its fields."""
    if value is None:
        return Wire()
    if isinstance(value, Wire):
        return value
    if isinstance(value, Mapping):
        names = {field.name for field in dataclasses.fields(Wire)}
        unknown = [name for name in value if name not in names]
        if unknown:
            raise InvalidArgumentError(f"wire: unknown option(s) {', '.join(unknown)}: use {', '.join(sorted(names))}")
        return Wire(**value)
    raise InvalidArgumentError(f"wire must be a Wire (or a dict of its fields), got {type(value).__name__}")
