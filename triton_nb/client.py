"""The in-process client: tritonclient-like calls on an in-kernel server, with no network.

Inputs are numpy arrays (used as they are: no copies) or a pandas DataFrame, whose columns are
matched to the model's inputs by name and converted to each input's datatype and shape — so a
raw TabFormer DataFrame goes straight into the fraud ensemble. Results have ``as_numpy(name)``
and ``as_pandas()``. ``infer_frame`` takes a DataFrame of any length: it splits it at the
model's ``max_batch_size`` and sends the pieces together.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from operator import attrgetter
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from tritonclient.grpc import model_config_pb2 as mc

from triton_nb._deprecation import version_or_latest
from triton_nb.errors import (
    InternalError,
    InvalidArgumentError,
    MissingDependencyError,
    TritonNBError,
    UnavailableError,
)
from triton_nb.frames import check_columns, frame_to_inputs, output_columns
from triton_nb.server.scheduling.together import after_batch
from triton_nb.tensors import (
    InferRequest,
    InferResponse,
    numpy_to_triton_dtype,
)

if TYPE_CHECKING:
    from triton_nb.server.service import InferenceService

__all__ = ["InProcessClient", "InferResult"]


_ARRAYS = frozenset({np.ndarray})
_DTYPE_KIND = attrgetter("dtype.kind")


class InferResult:
    """The result of one inference, like tritonclient's ``InferResult``."""

    def __init__(self, response: InferResponse) -> None:
        self._response = response

    def as_numpy(self, name: str) -> np.ndarray | None:
        return self._response.outputs.get(name)

    def as_pandas(self) -> pd.DataFrame:
        """Outputs as columns: ``name`` for one value per row, ``name_0..k`` for several."""
        return pd.DataFrame(output_columns(self._response.outputs))

    def get_response(self) -> dict[str, Any]:
        """The KServe v2 response header: model, version, id and output descriptions."""
        response = self._response
        return {
            "model_name": response.model_name,
            "model_version": str(response.model_version),
            "id": response.request_id,
            "outputs": [
                {"name": n, "datatype": numpy_to_triton_dtype(a.dtype), "shape": list(a.shape)}
                for n, a in response.outputs.items()
            ],
        }

    @property
    def response(self) -> InferResponse:
        return self._response


class InferAsyncRequest:
    """A request in flight (``async_infer``), like tritonclient.http's."""

    def __init__(self, future: Future) -> None:
        self._future = future

    def get_result(self, timeout: float | None = None) -> InferResult:
        return InferResult(self._future.result(timeout=timeout))


# How many failed row ranges one error message lists for each distinct failure.
_RANGES_SHOWN = 5


def _rows(start: int, stop: int) -> str:
    return f"row {start}" if stop - start == 1 else f"rows {start}-{stop - 1}"


def _frame_error(model_name: str, failures: list[tuple[int, int, BaseException]], requests: int) -> TritonNBError:
    """One error for every failed piece of a frame: the row ranges grouped by what went wrong.

    It is of the pieces' own class when they all failed alike, so that ``except
    InvalidArgumentError`` (and the wire status a front end derives from the class) still works."""
    groups: dict[str, list[str]] = {}
    for start, stop, error in failures:
        groups.setdefault(str(error) or type(error).__name__, []).append(_rows(start, stop))
    parts = []
    for message, ranges in groups.items():
        shown = ", ".join(ranges[:_RANGES_SHOWN])
        if len(ranges) > _RANGES_SHOWN:
            shown += f" and {len(ranges) - _RANGES_SHOWN} more range(s)"
        parts.append(f"{shown}: {message}")
    text = (f"model '{model_name}': {len(failures)} of {requests} request(s) of the DataFrame failed "
            f"(rows by position); " + "; ".join(parts))
    kinds = {type(error) for _, _, error in failures}
    kind = kinds.pop() if len(kinds) == 1 else TritonNBError
    if not issubclass(kind, TritonNBError) or kind is MissingDependencyError:  # no plain (message) constructor
        kind = TritonNBError
    return kind(text)


def _version(model_version: int | str | None, stacklevel: int = 5) -> int | None:
    """A call's ``model_version``: a number (also as text, as tritonclient takes it), or None for
    the version the policy serves; "" and -1 are that too, deprecated."""
    if model_version is None:  # the usual case, on every request's path
        return None
    return version_or_latest(model_version, parameter="model_version", stacklevel=stacklevel)


class InProcessClient:
    """Calls on an in-kernel server (:class:`~triton_nb.InferenceServer`, or any
    :class:`~triton_nb.server.service.InferenceService`) in this process."""

    def __init__(self, server: InferenceService) -> None:
        self._server = server

    # ------------------------------------------------------------------ inference
    def _request(
        self,
        model_name: str,
        inputs: Mapping[str, Any] | pd.DataFrame,
        outputs: Sequence[str] | None,
        model_version: int | str | None,
        request_id: str,
        priority: int,
        timeout_microseconds: int | None,
        parameters: Mapping[str, Any] | None,
        frame_config: Mapping[str, Any] | None = None,
    ) -> InferRequest:
        """The request; a DataFrame becomes tensors by ``frame_config`` (the model's config as JSON,
        fetched when not given)."""
        version = _version(model_version, stacklevel=6)
        if isinstance(inputs, pd.DataFrame):
            arrays = frame_to_inputs(frame_config or self._server.model_config_json(model_name, version), inputs)
        elif isinstance(inputs, Mapping):
            arrays = dict(inputs)
            # Only text given as unicode needs the config (to become BYTES); numpy arrays pass as they are.
            values = arrays.values()  # (checked with C-level loops: this runs for every request)
            if not {*map(type, values)} <= _ARRAYS or "U" in {*map(_DTYPE_KIND, values)}:
                config = self._server.input_config(model_name, version)
                arrays = {name: self._array(config, name, value) for name, value in arrays.items()}
        else:
            raise InvalidArgumentError(
                f"inputs must be a dict of name -> numpy array or a pandas DataFrame, got {type(inputs).__name__}"
            )
        return InferRequest(
            model_name=model_name,
            model_version=-1 if version is None else version,  # the request's "latest", as on the wire
            inputs=arrays,
            requested_outputs=list(outputs) if outputs else None,
            request_id=request_id,
            parameters=dict(parameters or {}),
            priority=priority,
            timeout_microseconds=timeout_microseconds or 0,
        )

    @staticmethod
    def _array(config: mc.ModelConfig, name: str, value: Any) -> np.ndarray:
        array = value if isinstance(value, np.ndarray) else np.asarray(value)
        spec = next((t for t in config.input if t.name == name), None)
        if spec is not None and spec.data_type == mc.TYPE_STRING and array.dtype.kind == "U":
            return np.char.encode(array, "utf-8").astype(object)  # Triton carries BYTES as bytes
        return array

    def infer(
        self,
        model_name: str,
        inputs: Mapping[str, Any] | pd.DataFrame,
        *,
        outputs: Sequence[str] | None = None,
        model_version: int | str | None = None,
        request_id: str = "",
        priority: int = 0,
        timeout_microseconds: int | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferResult:
        """Run an inference and wait for it. ``timeout_microseconds`` bounds the wait (and is
        the request's queue timeout where the model's queue policy allows an override)."""
        request = self._request(model_name, inputs, outputs, model_version, request_id, priority,
                                timeout_microseconds, parameters)
        wait = None if timeout_microseconds is None else timeout_microseconds / 1e6
        return InferResult(self._server.infer(request, timeout_s=wait))

    def async_infer(
        self,
        model_name: str,
        inputs: Mapping[str, Any] | pd.DataFrame,
        *,
        outputs: Sequence[str] | None = None,
        model_version: int | str | None = None,
        request_id: str = "",
        priority: int = 0,
        timeout_microseconds: int | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferAsyncRequest:
        """Start an inference (``infer``'s arguments); ``get_result()`` on the returned object waits
        for it. A misspelt keyword is a TypeError naming it, not an option silently dropped."""
        request = self._request(model_name, inputs, outputs, model_version, request_id, priority,
                                timeout_microseconds, parameters)
        return InferAsyncRequest(self._server.infer_async(request))

    def infer_frame(
        self,
        model_name: str,
        frame: pd.DataFrame,
        *,
        max_in_flight: int = 8,
        outputs: Sequence[str] | None = None,
        model_version: int | str | None = None,
        request_id: str = "",
        priority: int = 0,
        timeout_microseconds: int | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> pd.DataFrame:
        """Run a DataFrame of any length: one request per ``max_batch_size`` rows, sent together.

        ``infer`` keeps Triton's rule and refuses a batch over the model's ``max_batch_size``;
        this splits ``frame`` into pieces of at most that many rows (the limit in force now,
        with any live change), sends them without waiting in between, so the server's dynamic
        batchers see them together, and joins the answers. A model with ``max_batch_size`` 0 does
        not batch: each row is then a request of its own (as Triton sees a non-batching model,
        one sample per request). Each column fills one value of its input per row, so an input
        given as a column must hold one value per row (dims ``[1]``); a model with a wider one
        is refused before anything is sent (numpy arrays through ``infer`` can feed it; for a
        model that does not batch, ``infer`` sends the frame whole as one request).

        At most ``max_in_flight`` pieces are in flight at once; the next one leaves as one is
        answered. That bounds the memory of converted inputs, and a model's ``max_queue_size``
        of at least ``max_in_flight`` refuses none of them; a frame of up to ``max_in_flight *
        max_batch_size`` rows goes out whole before the first wait.

        The other keywords are ``infer``'s — ``outputs``, ``model_version``, ``request_id``,
        ``priority``, ``timeout_microseconds``, ``parameters`` — and apply to every piece. As in
        ``infer``, ``timeout_microseconds`` is each request's queue timeout where the model's queue
        policy allows an override, and bounds the wait for each piece from when it was sent: a
        piece not answered by then is cancelled (the server drops it unless it is executing) and
        counts as failed.

        Returns one DataFrame with the columns ``InferResult.as_pandas()`` gives (the outputs:
        ``name``, or ``name_0..k`` for several values per row), its rows in ``frame``'s order and
        under ``frame``'s index, so ``frame.join(result)`` puts inputs and answers side by side.

        Raises ``InvalidArgumentError`` naming the model for an empty frame or a missing column.
        If any piece fails, every other piece is still run to its end, and
        then one error names the model and the failed row ranges (positions in ``frame``) with
        what went wrong; it is of the pieces' error class when they all failed alike. Only an
        interruption (``KeyboardInterrupt``) stops early: the pieces still queued are cancelled.
        """
        if not isinstance(frame, pd.DataFrame):
            raise InvalidArgumentError(
                f"model '{model_name}': infer_frame takes a pandas DataFrame, got {type(frame).__name__}")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise InvalidArgumentError(
                f"model '{model_name}': max_in_flight must be a whole number >= 1, got {max_in_flight!r}")
        version = _version(model_version)
        # model_config, not input_config: a live update may have lowered max_batch_size, and infer
        # refuses pieces over the limit in force.
        limit = self._server.model_config(model_name, version).max_batch_size
        config = self._server.input_config(model_name, version)
        frame_config = self._server.model_config_json(model_name, version)
        if len(frame) == 0:
            raise InvalidArgumentError(f"model '{model_name}': the DataFrame has no rows")
        # Checked once here: every piece would otherwise fail alike, after all of them had run.
        check_columns(frame_config, frame)
        for spec in config.input:
            values = int(np.prod([d if d != -1 else 1 for d in spec.dims]))
            if spec.name in frame.columns and values != 1:
                if limit > 0:
                    raise InvalidArgumentError(
                        f"model '{model_name}': input '{spec.name}' takes {values} values per row (dims "
                        f"{list(spec.dims)}), but a DataFrame column gives one; send it as a numpy array")
                raise InvalidArgumentError(
                    f"model '{model_name}' does not batch (max_batch_size 0), so infer_frame sends one request "
                    f"per row, but input '{spec.name}' takes {values} values per request (dims {list(spec.dims)}) "
                    f"and a row gives one; to send the frame as one request, use infer()")
        step = limit if limit > 0 else 1
        pieces = [(start, min(start + step, len(frame))) for start in range(0, len(frame), step)]
        wait_s = None if timeout_microseconds is None else timeout_microseconds / 1e6
        responses: list[InferResponse | None] = [None] * len(pieces)
        failures: list[tuple[int, int, BaseException]] = []
        in_flight: dict[Future, tuple[int, float | None]] = {}
        sent = 0
        try:
            while sent < len(pieces) or in_flight:
                while sent < len(pieces) and len(in_flight) < max_in_flight:
                    start, stop = pieces[sent]
                    try:
                        request = self._request(
                            model_name, frame.iloc[start:stop], outputs, version, request_id, priority,
                            timeout_microseconds, parameters, frame_config)
                        future = self._server.infer_async(request)
                    except TritonNBError as exc:  # refused at once (a bad value, a full queue): this piece only
                        failures.append((start, stop, exc))
                    else:
                        in_flight[future] = (sent, None if wait_s is None else time.monotonic() + wait_s)
                    sent += 1
                if not in_flight:
                    continue
                deadlines = [d for _, d in in_flight.values() if d is not None]
                timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
                done, _ = wait(in_flight, timeout=timeout, return_when=FIRST_COMPLETED)
                for future in done:
                    index, _ = in_flight.pop(future)
                    error = future.exception()
                    if error is None:
                        responses[index] = future.result()
                    else:
                        failures.append((*pieces[index], error))
                now = time.monotonic()
                for future, (index, deadline) in list(in_flight.items()):
                    if deadline is not None and deadline <= now:
                        # as infer does: the server drops a cancelled request it has not started
                        future.cancel()
                        del in_flight[future]
                        failures.append((*pieces[index], UnavailableError(
                            f"model '{model_name}': no response within {wait_s:g} s (request timed out)")))
        except BaseException:
            for future in in_flight:
                future.cancel()
            raise
        if failures:
            failures.sort(key=lambda failure: failure[0])
            raise _frame_error(model_name, failures, len(pieces)) from failures[0][2]
        answered = [response for response in responses if response is not None]  # all of them: none failed
        return pd.DataFrame(self._join_outputs(model_name, pieces, answered, limit > 0), index=frame.index)

    @staticmethod
    def _join_outputs(model_name: str, pieces: list[tuple[int, int]], responses: list[InferResponse],
                      batching: bool) -> dict[str, Any]:
        """The pieces' outputs end to end, as :meth:`InferResult.as_pandas` columns."""
        parts: dict[str, list[np.ndarray]] = {name: [] for name in responses[0].outputs}
        for (start, stop), response in zip(pieces, responses, strict=True):
            for name, chunks in parts.items():
                array = response.outputs.get(name)
                if array is None:
                    raise InternalError(f"model '{model_name}': no output '{name}' for {_rows(start, stop)}")
                # Without batching an output is one request's whole tensor: one row of the result.
                array = array if batching else array[np.newaxis]
                if array.shape[0] != stop - start:
                    raise InternalError(
                        f"model '{model_name}': output '{name}' has {array.shape[0]} rows for {_rows(start, stop)}")
                chunks.append(array)
        joined: dict[str, np.ndarray] = {}
        for name, chunks in parts.items():
            if len({chunk.shape[1:] for chunk in chunks}) == 1:
                joined[name] = np.concatenate(chunks)
            else:  # a variable-shape output: one array per row, kept whole
                rows = np.empty(sum(len(chunk) for chunk in chunks), dtype=object)
                rows[:] = [row for chunk in chunks for row in chunk]
                joined[name] = rows
        return output_columns(joined)

    def stream_infer(
        self,
        model_name: str,
        inputs: Mapping[str, Any] | pd.DataFrame,
        *,
        outputs: Sequence[str] | None = None,
        model_version: int | str | None = None,
        request_id: str = "",
        priority: int = 0,
        timeout_microseconds: int | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> Iterator[InferResult]:
        """Responses of a decoupled model, as they come (Triton's streaming), until the final one
        (``infer``'s arguments)."""
        import queue

        request = self._request(model_name, inputs, outputs, model_version, request_id, priority,
                                timeout_microseconds, parameters)
        arrivals: queue.SimpleQueue = queue.SimpleQueue()
        request.response_sender = lambda response, final: arrivals.put((response, final))
        future = self._server.infer_async(request)
        future.add_done_callback(lambda f: arrivals.put((f.exception(), True)) if f.exception() else None)
        while True:
            item, final = arrivals.get()
            if isinstance(item, BaseException):
                raise item
            if item is not None:
                if item.error is not None:
                    raise item.error
                yield InferResult(item)
            if final:
                return

    async def ainfer(
        self,
        model_name: str,
        inputs: Mapping[str, Any] | pd.DataFrame,
        *,
        outputs: Sequence[str] | None = None,
        model_version: int | str | None = None,
        request_id: str = "",
        priority: int = 0,
        timeout_microseconds: int | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> InferResult:
        """``await client.ainfer(...)``: the awaitable variant, for asyncio code (``infer``'s arguments)."""
        pending = self.async_infer(model_name, inputs, outputs=outputs, model_version=_version(model_version),
                                   request_id=request_id, priority=priority,
                                   timeout_microseconds=timeout_microseconds, parameters=parameters)
        return InferResult(await _relay(asyncio.get_running_loop()).attach(pending._future))

    # ------------------------------------------------------------------ the rest of the API
    def is_server_live(self) -> bool:
        return self._server.is_server_live()

    def is_server_ready(self) -> bool:
        return self._server.is_server_ready()

    def is_model_ready(self, model_name: str, model_version: int | str | None = None) -> bool:
        return self._server.is_model_ready(model_name, _version(model_version))

    def get_model_config(self, model_name: str, model_version: int | str | None = None) -> dict[str, Any]:
        """Triton's JSON form of the effective config (as tritonclient.http returns it)."""
        return self._server.model_config_json(model_name, _version(model_version))

    def get_model_metadata(self, model_name: str, model_version: int | str | None = None) -> dict[str, Any]:
        return self._server.model_metadata(model_name, _version(model_version))

    def load_model(self, model_name: str, config: str | None = None, files: Mapping[str, bytes] | None = None) -> None:
        self._server.load_model(model_name, config=config, files=dict(files) if files else None)

    def unload_model(self, model_name: str, unload_dependents: bool = False) -> None:
        self._server.unload_model(model_name, unload_dependents=unload_dependents)

    def get_inference_statistics(self, model_name: str = "", model_version: int | str | None = None) -> dict[str, Any]:
        """Triton's statistics JSON: of every model (``model_name`` empty), or of one, all its
        versions (``model_version`` None) or one."""
        return self._server.statistics(model_name or None, _version(model_version))

    def get_model_repository_index(self) -> list[dict[str, str]]:
        return self._server.repository_index()


class _LoopRelay:
    """Hands finished requests to one asyncio loop, one wake-up for all that finish together.

    A batch's requests finish one after another on the model's worker thread. Waking the loop for
    each (as ``asyncio.wrap_future`` does: a ``call_soon_threadsafe`` and a write to its self-pipe
    per request) costs a loop iteration per request; here the first of them schedules the hand-over
    and the rest join it while it is pending, so a loop awaiting a batch of 64 wakes once."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._finished: list[tuple[asyncio.Future, Future]] = []
        self.wakeups = 0  # hand-overs scheduled (read by the tests)

    def attach(self, future: Future) -> asyncio.Future:
        """An asyncio future on this loop that follows ``future``; cancelling it cancels ``future``."""
        waiter = self._loop.create_future()
        waiter.add_done_callback(lambda w: future.cancel() if w.cancelled() else None)
        future.add_done_callback(lambda f: self._arrived(waiter, f))
        return waiter

    def _arrived(self, waiter: asyncio.Future, finished: Future) -> None:
        with self._lock:
            first = not self._finished
            self._finished.append((waiter, finished))
        # On a worker answering a batch, the hand-over waits until the whole batch is answered:
        # otherwise the loop, woken by the first answer, could take the GIL between two of them
        # and need waking again for each one after
        if first and not after_batch(self._schedule):
            self._schedule()

    def _schedule(self) -> None:
        self.wakeups += 1
        try:
            self._loop.call_soon_threadsafe(self._hand_over)
        except RuntimeError:  # the loop was closed: nobody awaits these any more
            with self._lock:
                self._finished.clear()

    def _hand_over(self) -> None:
        with self._lock:
            finished, self._finished = self._finished, []
        for waiter, future in finished:
            if waiter.done():  # the awaiting task was cancelled
                continue
            if future.cancelled():
                waiter.cancel()
            elif (error := future.exception()) is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(future.result())


_RELAYS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopRelay] = weakref.WeakKeyDictionary()


def _relay(loop: asyncio.AbstractEventLoop) -> _LoopRelay:
    """The relay of ``loop`` (called on that loop's thread only)."""
    relay = _RELAYS.get(loop)
    if relay is None:
        relay = _RELAYS[loop] = _LoopRelay(loop)
    return relay
