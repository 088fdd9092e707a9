"""pb_utils' tensors: :class:`Tensor`, Triton's type codes and the BYTES helpers.

Part of the surface :mod:`triton_nb.backends.pb_utils` exposes. ``triton_dtype()`` is Triton's
numeric type code (``TRITONSERVER_DataType``: FP32 is 11, BYTES is 13), as the real module
returns it. BYTES tensors are object arrays (of ``bytes``, or of ``str`` which go out UTF-8
encoded) or ``bytes_`` arrays; a unicode (``<U``) array is refused, as in Triton.
``to_dlpack``/``from_dlpack`` use numpy's DLPack support (CPU only; BYTES cannot go through DLPack).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from triton_nb.backends._pb_errors import TritonModelException

__all__ = [
    "TRITON_STRING_TO_NUMPY",
    "Tensor",
    "deserialize_bytes_tensor",
    "numpy_to_triton_type",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
]

# Triton's TRITONSERVER_DataType codes; BF16 (14) has no numpy type.
_TYPE_CODES: dict[np.dtype, int] = {
    np.dtype(np.bool_): 1,
    np.dtype(np.uint8): 2,
    np.dtype(np.uint16): 3,
    np.dtype(np.uint32): 4,
    np.dtype(np.uint64): 5,
    np.dtype(np.int8): 6,
    np.dtype(np.int16): 7,
    np.dtype(np.int32): 8,
    np.dtype(np.int64): 9,
    np.dtype(np.float16): 10,
    np.dtype(np.float32): 11,
    np.dtype(np.float64): 12,
    np.dtype(np.object_): 13,
}
_BYTES = 13
_CODE_TYPES: dict[int, type] = {code: dtype.type for dtype, code in _TYPE_CODES.items()}

TRITON_STRING_TO_NUMPY: dict[str, type] = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def _type_code(dtype: np.dtype) -> int | None:
    code = _TYPE_CODES.get(dtype)
    if code is None and dtype.kind == "S":
        return _BYTES
    return code


def _bytes_item(value: Any) -> bytes:
    # As Triton serialises a BYTES tensor: bytes stay as they are, anything else becomes str(x) in UTF-8.
    if isinstance(value, bytes):
        return value
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    return str(value).encode("utf-8")


def _as_bytes_array(array: np.ndarray) -> np.ndarray:
    """The object array of ``bytes`` a BYTES tensor is on the server side (same shape)."""
    if array.dtype == np.object_ and all(type(item) is bytes for item in array.flat):
        return array
    out = np.empty(array.shape, dtype=object)
    flat = out.reshape(-1)  # a view: out is C-contiguous
    for index, item in enumerate(array.flat):
        flat[index] = _bytes_item(item.item() if isinstance(item, np.generic) else item)
    return out


class _CapsuleHolder:
    """Lets numpy import a bare DLPack capsule (numpy only takes objects with ``__dlpack__``)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU; a capsule of device memory makes numpy refuse it


class Tensor:
    """A named tensor: ``pb_utils.Tensor("OUTPUT0", numpy_array)``."""

    __slots__ = ("_array", "_dtype", "_name")

    def __init__(self, name: str, numpy_array: Any) -> None:
        if not isinstance(name, str) or not name:
            raise TritonModelException("Tensor name cannot be an empty string.")
        array = numpy_array if isinstance(numpy_array, np.ndarray) else np.asarray(numpy_array)
        code = _type_code(array.dtype)
        if code is None:
            hint = " Use an object array (np.object_) of str or bytes for strings." if array.dtype.kind == "U" else ""
            raise TritonModelException(
                f"Tensor '{name}': NumPy dtype {array.dtype} is not supported by the Python backend.{hint}"
            )
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)  # as Triton does
        self._name = name
        self._array = array
        self._dtype = code

    @classmethod
    def _wrap(cls, name: str, array: np.ndarray) -> Tensor:
        """An input tensor around a server array, without checks or copies."""
        tensor = cls.__new__(cls)
        tensor._name = name
        code = _TYPE_CODES.get(array.dtype)  # the common case: one look-up
        if code is None:
            if array.dtype.kind in "SU":
                array = _as_bytes_array(array)
            code = _type_code(array.dtype) or _BYTES
        tensor._array = array
        tensor._dtype = code
        return tensor

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def triton_dtype(self) -> int:
        """Triton's ``TRITONSERVER_DataType`` code (FP32 is 11, BYTES is 13)."""
        return self._dtype

    def shape(self) -> list[int]:
        return [int(d) for d in self._array.shape]

    def is_cpu(self) -> bool:
        return True

    def _server_array(self) -> np.ndarray:
        """The array as the server carries it: BYTES as an object array of ``bytes``."""
        return _as_bytes_array(self._array) if self._dtype == _BYTES else self._array

    # -- DLPack ------------------------------------------------------------------------
    def _dlpack_source(self) -> np.ndarray:
        if self._dtype == _BYTES:
            raise TritonModelException(f"Tensor '{self._name}': DLPack does not support string (BYTES) tensors.")
        # numpy refuses to export read-only arrays through the legacy protocol; hand out a copy.
        return self._array if self._array.flags.writeable else self._array.copy()

    def to_dlpack(self) -> Any:
        """A DLPack capsule sharing this tensor's memory (a copy for read-only arrays)."""
        return self._dlpack_source().__dlpack__()

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._dlpack_source().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)

    @staticmethod
    def from_dlpack(name: str, dlpack_tensor: Any) -> Tensor:
        """A Tensor from a DLPack capsule or an object with ``__dlpack__`` (CPU memory only)."""
        source = dlpack_tensor if hasattr(dlpack_tensor, "__dlpack__") else _CapsuleHolder(dlpack_tensor)
        try:
            array = np.from_dlpack(source)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            raise TritonModelException(
                f"Tensor.from_dlpack('{name}'): {exc} (triton_nb takes CPU tensors only)"
            ) from None
        if not array.flags.c_contiguous:
            raise TritonModelException(f"Tensor.from_dlpack('{name}'): the DLPack tensor must be C-contiguous")
        return Tensor(name, array)

    def __repr__(self) -> str:
        return f"Tensor(name={self._name!r}, dtype={self._array.dtype}, shape={self.shape()})"



# --------------------------------------------------------------------------- types and bytes


def triton_string_to_numpy(triton_type_string: str) -> type:
    """``"TYPE_FP32"`` -> ``np.float32``; ``"TYPE_STRING"`` -> ``np.object_``."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> type | None:
    """Triton's type code (11) -> numpy type (``np.float32``); None for codes without one."""
    return _CODE_TYPES.get(int(data_type))


def numpy_to_triton_type(data_type: Any) -> int | None:
    """numpy dtype or type -> Triton's type code; None when Triton has none."""
    try:
        return _type_code(np.dtype(data_type))
    except TypeError:
        return None


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """Triton's BYTES wire form: each element as a 4-byte little-endian length, then its bytes, in C order.

    Object arrays (``bytes`` kept as they are, anything else as ``str`` in UTF-8), ``bytes_`` and
    unicode arrays are accepted; other dtypes give None, as in Triton.
    """
    array = np.asarray(input_tensor)
    if array.size == 0:
        return b""
    if array.dtype.kind not in "OSU":
        return None
    parts = []
    for item in array.flat:
        data = _bytes_item(item.item() if isinstance(item, np.generic) else item)
        parts.append(struct.pack("<I", len(data)))
        parts.append(data)
    return b"".join(parts)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """The inverse of :func:`serialize_byte_tensor`: a 1-D object array of ``bytes``."""
    buffer = memoryview(encoded_tensor).cast("B") if not isinstance(encoded_tensor, bytes) else encoded_tensor
    items = []
    offset = 0
    size = len(buffer)
    while offset < size:
        if offset + 4 > size:
            raise TritonModelException("Invalid bytes tensor data: incomplete length field")
        (length,) = struct.unpack_from("<I", buffer, offset)
        offset += 4
        if offset + length > size:
            raise TritonModelException("Invalid bytes tensor data: string extends beyond buffer")
        items.append(bytes(buffer[offset:offset + length]))
        offset += length
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out

