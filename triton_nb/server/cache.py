"""Triton's local response cache: identical requests answered without running the model.

Triton holds the responses of successful requests in one cache shared by every model
(``tritonserver --cache-config local,size=BYTES``; here ``serve(..., cache_size_bytes=BYTES)`` or
``triton-nb serve --cache-config local,size=BYTES``); a model takes part when its config says
``response_cache { enable: true }``. Both are needed: without a server cache the flag does nothing
(the model loads, nothing is logged, its ``nv_cache_*_per_model`` series stay at zero, as Triton
2.51 does). What this module holds:

* :class:`ResponseCache` — the store: least-recently-used entries within a byte budget (the
  outputs' bytes plus the key and names), thread-safe; an entry bigger than the whole cache is not
  inserted. Its counters are Triton's local-cache gauges (``nv_cache_num_entries``, ``nv_cache_util``
  ...; :class:`CacheCollector`).
* :func:`request_key` — the key of a request: a 256-bit BLAKE2b digest of the model name, version,
  load generation, the requested output names and every input's name, datatype, shape and bytes,
  each length-prefixed (BYTES elements with their 4-byte lengths, as on Triton's wire), so no two
  different requests share an encoding and a collision is not something anyone can find.
* :class:`CacheSwitches` — which model versions use the cache: the config's flag, or a live
  setting (``Server.update_response_cache``, the tuner's knob) that lasts until the version is
  reloaded.
* :class:`ServerCache` — the request path the server calls: look up before queueing (a hit is
  answered at once and counted as Triton's ``UpdateSuccessCacheHit``: a success with its request
  and queue time and a cache hit, no inference or execution count, no compute time), and on a
  successful miss insert the response and count Triton's ``UpdateSuccessCacheMiss`` (cache miss
  count and lookup+insert time, also added to the request's time) before the caller gets it.

Where this differs from Triton 2.51, on purpose (Triton's behaviour was observed on its binary):

* Triton's key is a 64-bit ``boost::hash_combine`` of name, version and the inputs' names and raw
  bytes only: two requests with the same bytes in different shapes collide (observed: a ``[4, 2]``
  request got the cached ``[2, 4]`` answer), and a request asking for other outputs gets the first
  request's outputs (observed). Here shape, datatype and requested outputs are part of the key.
* Triton caches a failed response (observed: the second identical failing request succeeded with
  no outputs), against its own documentation; here only successful responses are inserted.
* Triton keeps entries across a reload of the same version; here the key carries the load
  generation of the model (and, for an ensemble, of its composing models), so a reloaded model
  never answers from its predecessor's entries.

What is the same: request parameters are not part of the key; an identical request that missed
while another one was being computed is neither a hit nor a miss when its insert finds the entry
there (Triton's ``ALREADY_EXISTS``); a failed insert (an entry bigger than the cache) still counts a
miss; decoupled models are never cached (Triton refuses to load them with the cache enabled, see
:func:`response_cache_problem`); an ensemble with the cache enabled is looked up at the top level
before any step runs, and its composing models cache independently when they enable it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any

import numpy as np
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from triton_nb.errors import InvalidArgumentError, TritonNBError, UnavailableError
from triton_nb.server.scheduling.futures import ResponseFuture
from triton_nb.tensors import InferRequest, InferResponse, numpy_to_triton_dtype

__all__ = [
    "CACHE_NAMES",
    "EXISTS",
    "INSERTED",
    "TOO_LARGE",
    "CacheCollector",
    "CacheSwitches",
    "ResponseCache",
    "ServerCache",
    "entry_nbytes",
    "parse_cache_config",
    "request_key",
    "response_cache_problem",
]

log = logging.getLogger(__name__)

#: The cache implementations ``--cache-config`` knows; Triton also ships ``redis``.
CACHE_NAMES = ("local",)

_PERSON = b"triton-nb-cache1"  # BLAKE2b personalization: keys of this scheme only
_LENGTH = 8  # bytes of every length prefix in a key's encoding
_OBJECT_KIND = "O"  # numpy's kind of BYTES tensors (object arrays of bytes)


def parse_cache_config(values: Sequence[str]) -> int:
    """The cache size of ``tritonserver``'s ``--cache-config`` values (``local,size=1048576``; the
    flag may repeat, one ``key=value`` each, the last ``size`` wins).

    Only the ``local`` cache exists here: another name is refused, naming it. As Triton's local
    cache, ``size`` is required (bytes, > 0) and other keys are ignored (with a warning)."""
    size: int | None = None
    for value in values:
        name, comma, setting = value.partition(",")
        name = name.strip()
        if not comma or "=" not in setting:
            raise InvalidArgumentError(f"--cache-config {value!r}: expected <cache>,<key>=<value>, "
                                       "e.g. local,size=1048576")
        if name not in CACHE_NAMES:
            raise InvalidArgumentError(f"--cache-config {value!r}: cache '{name}' is not available: triton-nb "
                                       "has the local cache only (--cache-config local,size=BYTES)")
        key, _, text = setting.partition("=")
        key, text = key.strip(), text.strip()
        if key != "size":
            log.warning("--cache-config %r: the local cache has no setting '%s' (ignored)", value, key)
            continue
        if not text.isdigit() or int(text) <= 0:
            raise InvalidArgumentError(f"--cache-config {value!r}: size must be a whole number of bytes > 0")
        size = int(text)
    if size is None:
        raise InvalidArgumentError("--cache-config: the local cache needs a size (--cache-config local,size=BYTES)")
    return size


def response_cache_problem(config: Any) -> str | None:
    """Triton's load-time refusal of a config that enables the response cache where Triton does
    not support it (``ValidateModelConfig`` in core's ``model_config_utils.cc``), or None.
    Triton refuses these whether or not the server has a cache."""
    if not config.response_cache.enable:
        return None
    if config.HasField("sequence_batching"):
        return (f"Response Cache does not currently support model {config.name} with sequence batching "
                "scheduler. Please disable the response cache.")
    if config.model_transaction_policy.decoupled:
        return _decoupled_problem(config.name)
    return None


def _decoupled_problem(model: str) -> str:
    return (f"Response Cache does not currently support model {model} with 'decoupled' transaction policy. "
            "Please disable the response cache.")


# ---------------------------------------------------------------------- keys and sizes


def _field(digest: Any, data: bytes | memoryview) -> None:
    digest.update(len(data).to_bytes(_LENGTH, "little"))
    digest.update(data)


def _bytes_elements(array: np.ndarray) -> bytes | None:
    """A BYTES tensor as Triton's wire has it: each element's 4-byte length, then its bytes."""
    parts = []
    for element in array.reshape(-1):
        if isinstance(element, str):
            element = element.encode("utf-8")
        elif not isinstance(element, (bytes, bytearray)):
            return None
        parts.append(len(element).to_bytes(4, "little"))
        parts.append(bytes(element))
    return b"".join(parts)


def request_key(model: str, version: int, generation: Sequence[int], request: InferRequest) -> bytes | None:
    """The cache key of ``request`` for ``model`` ``version`` (see the module); None when an input
    cannot be hashed (a BYTES element that is not bytes or str), and the request is not cached."""
    digest = hashlib.blake2b(digest_size=32, person=_PERSON)
    _field(digest, model.encode("utf-8"))
    _field(digest, f"{int(version)}:{','.join(map(str, generation))}".encode())
    requested = request.requested_outputs
    _field(digest, b"*" if not requested else "\0".join(sorted(requested)).encode("utf-8"))
    inputs = request.inputs
    digest.update(len(inputs).to_bytes(_LENGTH, "little"))
    for name in sorted(inputs):
        array = inputs[name]
        if not isinstance(array, np.ndarray):
            array = np.asarray(array)
        _field(digest, name.encode("utf-8"))
        try:
            datatype = numpy_to_triton_dtype(array.dtype)
        except TritonNBError:
            return None
        _field(digest, datatype.encode())
        _field(digest, b"".join(int(d).to_bytes(_LENGTH, "little", signed=True) for d in array.shape))
        if datatype == "BYTES":
            data = _bytes_elements(array)
            if data is None:
                return None
            _field(digest, data)
        else:
            if array.dtype.byteorder == ">":
                array = array.astype(array.dtype.newbyteorder("<"))
            _field(digest, memoryview(np.ascontiguousarray(array)).cast("B"))
    return digest.digest()


def _array_nbytes(array: np.ndarray) -> int:
    if array.dtype.kind == _OBJECT_KIND:
        return sum(4 + len(e) if isinstance(e, (bytes, bytearray, str)) else 4 for e in array.reshape(-1))
    return int(array.nbytes)


def entry_nbytes(key: bytes, outputs: dict[str, np.ndarray]) -> int:
    """What one entry costs in the cache's budget: its key, and per output its name, 8 bytes per
    dimension and its data (a BYTES element: 4 bytes of length plus its bytes, as Triton serializes
    it)."""
    return len(key) + sum(len(name.encode("utf-8")) + 8 * array.ndim + _array_nbytes(array)
                          for name, array in outputs.items())


# ---------------------------------------------------------------------- the store


@dataclass(frozen=True)
class _Entry:
    outputs: dict[str, np.ndarray]  # read-only copies
    parameters: dict[str, Any]
    nbytes: int


#: What :meth:`ResponseCache.insert` did.
INSERTED, EXISTS, TOO_LARGE = "inserted", "exists", "too_large"


class ResponseCache:
    """Least-recently-used responses within ``size_bytes`` (see :func:`entry_nbytes`); thread-safe.

    Entries hold copies of the outputs, made read-only, so neither the model (which may reuse its
    buffers) nor a caller (who gets copies on a hit) can change what later hits return."""

    def __init__(self, size_bytes: int) -> None:
        if int(size_bytes) <= 0:
            raise InvalidArgumentError(f"cache size must be > 0 bytes, got {size_bytes}")
        self.size_bytes = int(size_bytes)
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._used = 0
        self.lookups = self.hits = self.misses = self.evictions = 0
        self._lookup_ns = self._insertion_ns = 0

    def lookup(self, key: bytes) -> dict[str, Any] | None:
        """``{"outputs": ..., "parameters": ...}`` of the entry (fresh, writable copies), marked
        most recently used; None when absent."""
        started = time.monotonic_ns()
        with self._lock:
            entry = self._entries.get(key)
            self.lookups += 1
            if entry is None:
                self.misses += 1
            else:
                self.hits += 1
                self._entries.move_to_end(key)
        found = None
        if entry is not None:  # copied outside the lock: stored arrays are never written
            found = {"outputs": {name: array.copy() for name, array in entry.outputs.items()},
                     "parameters": dict(entry.parameters)}
        with self._lock:
            self._lookup_ns += time.monotonic_ns() - started
        return found

    def insert(self, key: bytes, outputs: dict[str, np.ndarray], parameters: dict[str, Any] | None = None) -> str:
        """Store a response: :data:`INSERTED`; :data:`EXISTS` when the key is already there (left as
        it is); :data:`TOO_LARGE` when the entry exceeds the whole cache (nothing is evicted).
        Least recently used entries are evicted until the new one fits."""
        started = time.monotonic_ns()
        try:
            with self._lock:
                if key in self._entries:
                    return EXISTS
            stored = {}
            for name, array in outputs.items():
                copy = np.array(array, copy=True)
                copy.flags.writeable = False
                stored[name] = copy
            nbytes = entry_nbytes(key, stored)
            if nbytes > self.size_bytes:
                return TOO_LARGE
            entry = _Entry(stored, dict(parameters or {}), nbytes)
            with self._lock:
                if key in self._entries:
                    return EXISTS
                while self._used + nbytes > self.size_bytes:
                    _, evicted = self._entries.popitem(last=False)
                    self._used -= evicted.nbytes
                    self.evictions += 1
                self._entries[key] = entry
                self._used += nbytes
            return INSERTED
        finally:
            elapsed = time.monotonic_ns() - started
            with self._lock:
                self._insertion_ns += elapsed

    def clear(self) -> None:
        """Drop every entry (the counters stay)."""
        with self._lock:
            self._entries.clear()
            self._used = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    @property
    def used_bytes(self) -> int:
        """Bytes the entries take, by :func:`entry_nbytes`."""
        return self._used

    @property
    def utilization(self) -> float:
        """``used_bytes / size_bytes``, Triton's ``nv_cache_util``."""
        return self._used / self.size_bytes

    def snapshot(self) -> dict[str, float]:
        """The local cache's gauges, by Triton's names (durations in microseconds)."""
        with self._lock:
            return {
                "nv_cache_util": self._used / self.size_bytes,
                "nv_cache_num_entries": len(self._entries),
                "nv_cache_num_hits": self.hits,
                "nv_cache_num_misses": self.misses,
                "nv_cache_num_lookups": self.lookups,
                "nv_cache_num_evictions": self.evictions,
                "nv_cache_lookup_duration": self._lookup_ns // 1000,
                "nv_cache_insertion_duration": self._insertion_ns // 1000,
            }


# The local cache's own gauges (local_cache src/local_cache.cc InitMetrics): name and help.
_CACHE_GAUGES = (
    ("nv_cache_util", "Cache utilization [0.0 - 1.0]"),
    ("nv_cache_num_entries", "Number of responses stored in response cache"),
    ("nv_cache_num_hits", "Number of cache hits in response cache"),
    ("nv_cache_num_misses", "Number of cache misses in response cache"),
    ("nv_cache_num_lookups", "Number of cache lookups in response cache"),
    ("nv_cache_num_evictions", "Number of cache evictions in response cache"),
    ("nv_cache_lookup_duration", "Total cache lookup duration (hit and miss), in microseconds"),
    ("nv_cache_insertion_duration", "Total cache insertion duration, in microseconds"),
)


class CacheCollector(Collector):
    """The server-wide gauges of a :class:`ResponseCache`, unlabelled, as Triton's local cache
    exports them (registered after the per-model families, where Triton lists them too)."""

    def __init__(self, cache: ResponseCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        values = self._cache.snapshot()
        for name, documentation in _CACHE_GAUGES:
            metric = Metric(name, documentation, "gauge")
            metric.add_sample(name, {}, values[name])
            yield metric


# ---------------------------------------------------------------------- which models use it


@dataclass
class _State:
    target: weakref.ReferenceType  # the loaded version this state belongs to
    configured: bool  # what its config says (the decoupled never)
    live: bool | None  # a live setting, overriding the config
    generation: int  # grows with every load of this name and version (and every forget)


class CacheSwitches:
    """Whether each loaded model version uses the cache: its config's ``response_cache.enable``,
    unless :meth:`set` changed it live. A reload (a new version object) starts from its config
    again, with the next load generation. Decoupled models never use it."""

    def __init__(self, resolve: Callable[[str, int], Any]) -> None:
        self._resolve = resolve
        self._lock = threading.Lock()
        self._states: dict[tuple[str, int], _State] = {}

    def _state(self, target: Any) -> _State:
        key = (target.name, target.version)
        state = self._states.get(key)
        if state is not None and state.target() is target:
            return state
        with self._lock:
            state = self._states.get(key)
            if state is not None and state.target() is target:
                return state
            config = target.config
            configured = bool(config.response_cache.enable) and not config.model_transaction_policy.decoupled
            generation = 0 if state is None else state.generation + 1
            state = self._states[key] = _State(weakref.ref(target), configured, None, generation)
            return state

    def enabled(self, target: Any) -> bool:
        """Whether requests to this loaded version go through the cache."""
        state = self._state(target)
        return state.configured if state.live is None else state.live

    def live(self, target: Any) -> bool | None:
        """The live setting of this version, None when its config decides."""
        return self._state(target).live

    def set(self, target: Any, enable: bool) -> None:
        """Turn the cache on or off for this version, from its next request, until it reloads."""
        if enable and target.config.model_transaction_policy.decoupled:
            raise InvalidArgumentError(_decoupled_problem(target.name))
        state = self._state(target)
        with self._lock:
            state.live = bool(enable)

    def forget(self, target: Any) -> None:
        """Make the version's cached responses unreachable (a new generation: they age out of the
        LRU), so that it starts cold, as after a reload."""
        state = self._state(target)
        with self._lock:
            state.generation += 1

    def generation(self, target: Any) -> tuple[int, ...]:
        """The load generation of a version; an ensemble's includes its composing models'."""
        own = self._state(target).generation
        ensemble = getattr(target, "ensemble", None)
        if ensemble is None:
            return (own,)
        parts = [own]
        for step in ensemble.plan:
            parts.extend(self.generation(self._resolve(step.model_name, step.model_version)))
        return tuple(parts)

    def series(self, name: str, version: int) -> bool:
        """Whether the version shows ``nv_cache_*_per_model`` series (its cache is enabled, in the
        config or live, whether or not the server has a cache: Triton's metric reporter follows
        the config)."""
        try:
            target = self._resolve(name, version)
        except TritonNBError:
            return False
        if target.version != version:
            return False
        return self.enabled(target)


# ---------------------------------------------------------------------- the request path


class _Lookup:
    """A request that missed: what is needed to insert its response when it is answered."""

    __slots__ = ("cache", "key", "lookup_ns", "stats")

    def __init__(self, cache: ResponseCache, key: bytes, lookup_ns: int, stats: Any) -> None:
        self.cache = cache
        self.key = key
        self.lookup_ns = lookup_ns
        self.stats = stats

    def finish(self, inner: Future) -> Future:
        """The future the caller gets: ``inner``'s answer, once a success was inserted and the
        miss counted (so a caller reading the statistics on its answer finds it there). Cancelling
        it cancels ``inner``."""
        outer = ResponseFuture()

        def answered(done: Future) -> None:
            if done.cancelled():
                outer.cancel()
                return
            error = done.exception()
            if error is not None:
                with contextlib.suppress(InvalidStateError):
                    outer.set_exception(error)
                return
            response = done.result()
            if isinstance(response, InferResponse) and response.error is None:
                self._insert(response)
            with contextlib.suppress(InvalidStateError):
                outer.set_result(response)

        def cancelled(done: Future) -> None:
            if done.cancelled():
                inner.cancel()

        outer.add_done_callback(cancelled)
        inner.add_done_callback(answered)
        return outer

    def _insert(self, response: InferResponse) -> None:
        started = time.monotonic_ns()
        outcome = self.cache.insert(self.key, response.outputs, response.parameters)
        insert_ns = time.monotonic_ns() - started
        if outcome == EXISTS:  # another identical request inserted it first: Triton counts no miss
            return
        if outcome == TOO_LARGE:
            log.warning("model '%s': response of %d bytes not cached: larger than the cache (%d bytes)",
                        response.model_name, entry_nbytes(self.key, response.outputs), self.cache.size_bytes)
        self.stats.record_cache_miss(self.lookup_ns + insert_ns)


class ServerCache:
    """The cache on a server's request path (see the module). ``submit`` is the server's own
    step submission, for the parts of a carried ensemble step."""

    def __init__(self, size_bytes: int, switches: CacheSwitches, submit: Callable[[InferRequest], Future]) -> None:
        self.store = ResponseCache(size_bytes)
        self.switches = switches
        self._submit = submit

    def lookup(self, target: Any, request: InferRequest) -> _Lookup | Future | None:
        """Before ``request`` is queued for ``target``: None when the cache is not used for it; an
        answered future on a hit (counted); else a :class:`_Lookup` whose ``finish`` wraps the
        future of the model's answer."""
        if not self.switches.enabled(target) or request.response_sender is not None:
            return None
        if request.carried_rows:
            return self._split(request)
        started = time.monotonic_ns()
        try:
            generation = self.switches.generation(target)
        except TritonNBError:  # a composing model is gone: the ensemble will say so
            return None
        key = request_key(target.name, target.version, generation, request)
        if key is None:
            return None
        found = self.store.lookup(key)
        ended = time.monotonic_ns()
        if found is None:
            return _Lookup(self.store, key, ended - started, target.stats)
        response = InferResponse(model_name=request.model_name, model_version=target.version,
                                 outputs=found["outputs"], request_id=request.request_id,
                                 parameters=found["parameters"])
        target.stats.record_cache_hit(request_ns=max(0, time.monotonic_ns() - request.arrival_ns),
                                      queue_ns=max(0, started - request.arrival_ns), hit_ns=ended - started)
        future = ResponseFuture()
        future.set_result(response)
        return future

    def _split(self, request: InferRequest) -> Future:
        """An ensemble step carrying several ensemble requests' rows, to a model that caches: Triton
        looks each of them up on its own, so each part goes through the cache (and the model)
        as its own request; the answer joins the parts' outputs in order."""
        parts, start = [], 0
        for rows in request.carried_rows:
            inputs = {name: array[start:start + rows] for name, array in request.inputs.items()}
            start += rows
            parts.append(InferRequest(
                model_name=request.model_name, model_version=request.model_version, inputs=inputs,
                requested_outputs=request.requested_outputs, request_id=request.request_id,
                priority=request.priority, timeout_microseconds=request.timeout_microseconds,
                arrival_ns=request.arrival_ns))
        futures = []
        try:
            for part in parts:
                futures.append(self._submit(part))
        except Exception:
            for future in futures:
                future.cancel()
            raise
        joined = ResponseFuture()
        remaining = [len(futures)]
        lock = threading.Lock()

        def part_done(_future: Future) -> None:
            with lock:
                remaining[0] -= 1
                if remaining[0]:
                    return
            _join(joined, futures, request)

        for future in futures:
            future.add_done_callback(part_done)
        return joined


def _join(joined: Future, futures: list[Future], request: InferRequest) -> None:
    """Answer a split carried step from its parts: the first error, or the outputs concatenated."""
    responses = []
    for future in futures:
        error = (UnavailableError(f"model '{request.model_name}': a part of the request was cancelled")
                 if future.cancelled() else future.exception())
        if error is not None:
            with contextlib.suppress(InvalidStateError):
                joined.set_exception(error)
            return
        responses.append(future.result())
    first = responses[0]
    try:
        outputs = {name: np.concatenate([r.outputs[name] for r in responses]) for name in first.outputs}
    except (KeyError, ValueError) as exc:
        with contextlib.suppress(InvalidStateError):
            joined.set_exception(InvalidArgumentError(f"model '{request.model_name}': the parts of a carried "
                                                      f"request could not be joined: {exc}"))
        return
    with contextlib.suppress(InvalidStateError):
        joined.set_result(InferResponse(first.model_name, first.model_version, outputs, request.request_id,
                                        dict(first.parameters)))
