"""Tables and tensors: a DataFrame's columns as a model's inputs, and a model's outputs as columns.

One set of rules for every way a table reaches a model — the in-process client
(``client.infer(model, frame)``, ``infer_frame``), ``%%triton_infer`` and the measurements of
:mod:`triton_nb.perf` — driven by the model's config in Triton's JSON form:

* a column per input: ``NAME`` holding a value per row (or a list per row for an input with
  several values), or ``NAME_0..k`` columns for an input with ``k + 1`` values per row;
* values become the input's datatype: text becomes numbers where the input is numeric, anything
  becomes UTF-8 ``bytes`` for a BYTES input (missing values as ``b""``; floats keep their
  spelling, ``91750.0``, as TabFormer writes zips);
* a batching model's tensors get the batch dimension first (a row per request row); a model that
  does not batch takes one row.

Every refusal names the model and the column.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from triton_nb.errors import InvalidArgumentError
from triton_nb.tensors import triton_to_numpy_dtype

__all__ = ["check_columns", "config_datatype", "frame_to_inputs", "output_columns", "to_datatype", "values_to_inputs"]


def config_datatype(spec: Mapping[str, Any]) -> str:
    """Triton's wire datatype ("FP32", "BYTES") of a config tensor in JSON form."""
    name = str(spec.get("data_type", "TYPE_INVALID")).removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def _dims(spec: Mapping[str, Any]) -> list[int]:
    return [int(d) for d in spec.get("dims", [])]


def _batching(config: Mapping[str, Any]) -> bool:
    return int(config.get("max_batch_size", 0)) > 0


def _to_bytes(values: np.ndarray) -> np.ndarray:
    def one(value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return b""
        return str(value).encode("utf-8")

    flat = np.empty(np.size(values), dtype=object)
    flat[:] = [one(v) for v in np.asarray(values, dtype=object).reshape(-1)]
    return flat.reshape(np.shape(values))


def to_datatype(values: Any, datatype: str, what: str) -> np.ndarray:
    """``values`` as a numpy array of Triton ``datatype``; ``what`` names them in the error."""
    array = np.asarray(values, dtype=object) if datatype == "BYTES" else np.asarray(values)
    if datatype == "BYTES":
        return _to_bytes(array)
    dtype = triton_to_numpy_dtype(datatype)
    if array.dtype == dtype:
        return array
    try:
        if array.dtype.kind in "OUS" and dtype.kind in "iuf":
            array = pd.to_numeric(pd.Series(array.reshape(-1)), errors="raise").to_numpy().reshape(array.shape)
        return array.astype(dtype)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"{what} cannot become {datatype}: {exc}") from None


def _shaped(array: np.ndarray, dims: list[int], batching: bool, what: str) -> np.ndarray:
    """``array`` in the request's shape: the batch dimension first when the model batches."""
    if batching and array.ndim == len(dims) and all(d > 0 for d in dims):
        array = array.reshape([-1, *dims])
    elif batching and array.ndim == 1 and len(dims) == 1:  # a value per row: dims [1] or [-1]
        array = array.reshape(-1, 1)
    elif not batching and array.ndim == len(dims) + 1 and array.shape[0] == 1:  # the one row of a request
        array = array[0]
    expected = len(dims) + (1 if batching else 0)
    if array.ndim != expected:  # the sizes of the dimensions are the server's to check, in Triton's words
        batch = "[-1] + " if batching else ""
        raise InvalidArgumentError(f"{what} has shape {list(array.shape)}; the model expects {batch}{dims}")
    return array


def _hint(name: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(name, candidates, n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _gathered(config: Mapping[str, Any], frame: pd.DataFrame) -> dict[str, Any]:
    """Each input's values as the frame holds them (a column, or ``NAME_0..k`` columns); raises
    naming every required input without a column."""
    columns = [str(c) for c in frame.columns]
    found: dict[str, Any] = {}
    missing = []
    for spec in config.get("input", []):
        name, dims = spec["name"], _dims(spec)
        if name in frame.columns:
            found[name] = frame[name]
            continue
        width = math.prod(dims) if dims and all(d > 0 for d in dims) else 0
        parts = [f"{name}_{i}" for i in range(width)]
        if width and all(p in frame.columns for p in parts):
            found[name] = frame[parts]
        elif not spec.get("optional"):
            missing.append(f"'{name}'{_hint(name, columns)}")
    if missing:
        raise InvalidArgumentError(
            f"model '{config.get('name', '?')}': the DataFrame has no column(s) {', '.join(missing)}")
    return found


def check_columns(config: Mapping[str, Any], frame: pd.DataFrame) -> None:
    """Raise, naming them, if required inputs have no column in ``frame`` (nothing is converted)."""
    _gathered(config, frame)


def frame_to_inputs(config: Mapping[str, Any], frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """A DataFrame's columns as the model's input tensors (see the module for the rules).
    Optional inputs without a column are left out."""
    model = config.get("name", "?")
    if len(frame) == 0:
        raise InvalidArgumentError(f"model '{model}': the DataFrame has no rows")
    found = _gathered(config, frame)
    batching = _batching(config)
    arrays = {}
    for spec in config.get("input", []):
        name = spec["name"]
        if name not in found:
            continue
        held = found[name]
        if isinstance(held, pd.DataFrame):  # NAME_0..k
            values = held.to_numpy()
        elif isinstance(held.iloc[0], list | tuple | np.ndarray):  # a list per row
            values = np.stack([np.asarray(v) for v in held])
        else:
            values = held.to_numpy()
        what = f"model '{model}': column '{name}'"
        arrays[name] = _shaped(to_datatype(values, config_datatype(spec), what), _dims(spec), batching, what)
    return arrays


def values_to_inputs(config: Mapping[str, Any], data: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """A mapping of input name to values (lists, arrays, scalars) as the model's input tensors."""
    model = config.get("name", "?")
    specs = {spec["name"]: spec for spec in config.get("input", [])}
    batching = _batching(config)
    arrays = {}
    for name, value in data.items():
        spec = specs.get(name)
        if spec is None:
            raise InvalidArgumentError(f"model '{model}' has no input '{name}'{_hint(str(name), list(specs))}")
        what = f"model '{model}': input '{name}'"
        arrays[name] = _shaped(to_datatype(value, config_datatype(spec), what), _dims(spec), batching, what)
    return arrays


def output_columns(outputs: Mapping[str, Any]) -> dict[str, Any]:
    """Output tensors as table columns, the first axis being the rows: ``name`` for one value per
    row, ``name_0..k`` for several, a column of arrays for more dimensions."""
    columns: dict[str, Any] = {}
    for name, array in outputs.items():
        if array.ndim == 1:
            columns[name] = array
        elif array.ndim == 2 and array.shape[1] == 1:
            columns[name] = array[:, 0]
        elif array.ndim == 2:
            for i in range(array.shape[1]):
                columns[f"{name}_{i}"] = array[:, i]
        else:
            columns[name] = list(array)
    return columns
