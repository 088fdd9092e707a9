"""Triton's rate limiter: a model instance executes only when the resources it names are free.

With ``rate_limit="execution_count"`` (``tritonserver --rate-limit=execution_count``; the default is
``off``, under which Triton and triton_nb ignore every ``rate_limiter`` block) each instance of an
instance group with ``rate_limiter { resources [...] priority: P }`` must hold, for the length of
each batch it executes, ``count`` copies of every resource it lists: from its device's pool, or
from the one global pool for a resource marked ``global``. Across all loaded models:

* a resource's copies default to the largest count any loaded instance asks for (so every
  instance can run); ``rate_limit_resources`` (``--rate-limit-resource NAME:COUNT[:DEVICE]``) sets
  them instead, for one device or for all, and an instance that asks for more than a set count
  fails its load, naming the model and the resource;
* among instances waiting for resources, one with priority ``P`` gets ``1/P`` of the chances of
  one with priority 1 (0 counts as 1): each grant moves an instance's turn on by its priority, and
  the waiting instance whose turn comes first and whose resources are free goes next.

:class:`RateLimiter` is shared by a server's models; :meth:`RateLimiter.register` gives each
instance a :class:`Gate` that its worker holds around every batch (``with gate:``).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from triton_nb.errors import InvalidArgumentError

__all__ = ["RATE_LIMIT_MODES", "Gate", "RateLimiter", "Resource", "parse_rate_limit_resource"]

RATE_LIMIT_MODES = ("off", "execution_count")
_GLOBAL = None  # the device key of the global pool


@dataclass(frozen=True)
class Resource:
    """``count`` copies of resource ``name`` that one instance needs, on its device or global."""

    name: str
    count: int
    is_global: bool = False


def parse_rate_limit_resource(text: str) -> tuple[str, int, int | None]:
    """``NAME:COUNT[:DEVICE]`` as ``--rate-limit-resource`` takes it: (name, count, device or None for all)."""
    parts = text.split(":")
    try:
        if len(parts) not in (2, 3) or not parts[0]:
            raise ValueError
        count = int(parts[1])
        device = int(parts[2]) if len(parts) == 3 else None
        if count < 0 or (device is not None and device < 0):
            raise ValueError
    except ValueError:
        raise InvalidArgumentError(f"rate limit resource {text!r} must be NAME:COUNT or NAME:COUNT:DEVICE, with "
                                   "COUNT and DEVICE non-negative integers") from None
    return parts[0], count, device


@dataclass(eq=False)
class Gate:
    """One instance's claim on the rate limiter: hold it around each execution."""

    limiter: RateLimiter
    model: str
    device: int
    needs: tuple[Resource, ...]
    priority: int
    turn: float = 0.0  # moves on by the priority at every grant; the lowest waiting turn goes first
    arrival: int = 0
    waiting: bool = field(default=False, repr=False)

    def __enter__(self) -> Gate:
        self.limiter._acquire(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self.limiter._release(self)

    def close(self) -> None:
        """The instance is gone: its needs no longer size the default pools."""
        self.limiter._unregister(self)


class RateLimiter:
    """The resource pools of one server and the instances competing for them."""

    def __init__(self, resources: Iterable[str] = ()) -> None:
        self._set: dict[tuple[str, int | None], int] = {}  # (name, device or None: every device) -> copies
        for text in resources:
            name, count, device = parse_rate_limit_resource(text)
            self._set[(name, device)] = count
        self._cond = threading.Condition()
        self._gates: list[Gate] = []
        self._in_use: dict[tuple[str, int | None], int] = {}
        self._arrivals = itertools.count()

    # ------------------------------------------------------------------ instances
    def register(self, model: str, device: int, resources: Iterable[Resource], priority: int) -> Gate:
        """The gate of one new instance of ``model`` on ``device``; refuses needs above a set count."""
        needs = tuple(resources)
        for need in needs:
            if need.count < 0:
                raise InvalidArgumentError(f"model '{model}': rate limiter resource '{need.name}' has a negative count")
            capacity = self._explicit(need, device)
            if capacity is not None and need.count > capacity:
                where = "globally" if need.is_global else f"on device {device}"
                raise InvalidArgumentError(
                    f"model '{model}': an instance needs {need.count} of rate limiter resource '{need.name}' but only "
                    f"{capacity} are available {where} (--rate-limit-resource)")
        with self._cond:
            turns = [g.turn for g in self._gates if g.needs]
            gate = Gate(self, model, device, needs, max(1, priority), turn=min(turns, default=0.0),
                        arrival=next(self._arrivals))
            self._gates.append(gate)
            self._cond.notify_all()
        return gate

    def _unregister(self, gate: Gate) -> None:
        with self._cond:
            if gate in self._gates:
                self._gates.remove(gate)
            self._cond.notify_all()

    # ------------------------------------------------------------------ pools
    def _key(self, need: Resource, device: int) -> tuple[str, int | None]:
        return (need.name, _GLOBAL if need.is_global else device)

    def _explicit(self, need: Resource, device: int) -> int | None:
        if need.is_global:
            return self._set.get((need.name, None))
        return self._set.get((need.name, device), self._set.get((need.name, None)))

    def capacity(self, name: str, device: int | None) -> int:
        """Copies of ``name`` on ``device`` (None: the global pool) with the instances loaded now."""
        with self._cond:
            return self._capacity((name, device))

    def _capacity(self, key: tuple[str, int | None]) -> int:  # under _cond
        name, device = key
        explicit = self._set.get(key) if device is None else self._set.get(key, self._set.get((name, None)))
        if explicit is not None:
            return explicit
        return max((need.count for g in self._gates for need in g.needs
                    if self._key(need, g.device) == key), default=0)

    def _free(self, gate: Gate) -> bool:  # under _cond
        return all(self._in_use.get(self._key(need, gate.device), 0) + need.count
                   <= self._capacity(self._key(need, gate.device)) for need in gate.needs)

    # ------------------------------------------------------------------ executions
    def _acquire(self, gate: Gate) -> None:
        if not gate.needs:  # nothing to wait for; it still takes its turn
            with self._cond:
                gate.turn += gate.priority
            return
        with self._cond:
            gate.waiting = True
            try:
                while not (self._free(gate) and self._first_of_the_free(gate)):
                    self._cond.wait(timeout=0.5)
            finally:
                gate.waiting = False
            for need in gate.needs:
                key = self._key(need, gate.device)
                self._in_use[key] = self._in_use.get(key, 0) + need.count
            gate.turn += gate.priority

    def _first_of_the_free(self, gate: Gate) -> bool:  # under _cond
        rivals = [g for g in self._gates if g.waiting and g is not gate and self._free(g)]
        return all((gate.turn, gate.arrival) <= (g.turn, g.arrival) for g in rivals)

    def _release(self, gate: Gate) -> None:
        if not gate.needs:
            return
        with self._cond:
            for need in gate.needs:
                key = self._key(need, gate.device)
                self._in_use[key] -= need.count
            self._cond.notify_all()
