"""Model backends: the built-in ones (FIL, Python, ONNX Runtime) and the way to add your own.

A backend serves the models whose config names it (``backend: "NAME"``). Write one by
subclassing :class:`Backend` (the contract is in :mod:`triton_nb.backends.base`) and make it
known with :func:`register_backend`, an entry point in the group ``triton_nb.backends``, or as a
Python-based backend folder (``NAME/model.py``) in the server's ``backend_directory``; see
:mod:`triton_nb.backends.registry` for the order they are searched in.
"""

from triton_nb.backends.base import Backend, ModelContext, ServerHandle
from triton_nb.backends.registry import register_backend, registered_backends, unregister_backend

__all__ = ["Backend", "ModelContext", "ServerHandle", "register_backend", "registered_backends",
           "unregister_backend"]
