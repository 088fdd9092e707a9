"""The real ``tritonserver`` (nvidia-pytriton's, Triton 2.51) for tests.

The server is started and stopped by :class:`triton_nb.tritonserver.TritonServerProcess` (see that
module for what it needs and how its Python backend's stub gets NumPy 1.x). The tests add one thing:
a server that dies on its own while a test uses it raises :class:`TritonServerCrashed`, which the
suite reruns once (``--only-rerun TritonServerCrashed``, pyproject.toml), and a failing test prints
what the running server said.

Usage::

    with RealTritonServer(repo) as server:
        client = tritonclient.http.InferenceServerClient(server.http_url)
"""

from __future__ import annotations

import sys
from types import TracebackType

from triton_nb.tritonserver import (
    TritonServerProcess,
    TritonServerStartError,
    TritonServerUnavailable,
    _layout,
    tritonserver_unavailable_reason,
)

__all__ = ["RealTritonServer", "TritonServerCrashed", "TritonServerStartError", "TritonServerUnavailable",
           "_layout", "tritonserver_unavailable_reason"]


class TritonServerCrashed(RuntimeError):
    """tritonserver died on its own (a signal, or an exit nobody asked for) while a test used it.

    Triton 2.51 on a loaded 2-core machine now and then segfaults (seen while it loads a model
    whose warm-up fails, and under a busy test run): the test that met it did not test triton_nb.
    """


class RealTritonServer(TritonServerProcess):
    """A :class:`~triton_nb.tritonserver.TritonServerProcess` that reports its death as :class:`TritonServerCrashed`."""

    def __enter__(self) -> RealTritonServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        died_with = self.died_with
        self.stop()  # the log stays readable after it
        if exc is None:
            return
        if died_with is not None:
            raise TritonServerCrashed(f"tritonserver died on its own (exit code {died_with}) while the test "
                                      f"used it; the test failed with {exc!r}{self._report()}") from exc
        # what the server said is the only clue to a failure inside it
        print(f"tritonserver (running) when the test failed:{self._report()}", file=sys.stderr)
