"""Loading a FIL model file: Treelite always (as FIL parses it), the native library when it can.

:func:`load_tree_model` finds the file the ``model_type`` parameter names in the version folder,
parses it with Treelite (a file FIL would refuse fails here too, with a message that says why
and, when it can tell, which ``model_type`` the file looks like), and loads it with XGBoost or
LightGBM as well when that library reads it, for speed and for SHAP values. The result, a
:class:`LoadedModel`, is what the engines (:mod:`.engines`), the compiler (:mod:`.compiled`)
and the backend (:mod:`.backend`) work from.

Imports from this package: :mod:`.common` only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from triton_nb._native_logs import route_native_logs
from triton_nb._optional import optional_module
from triton_nb.backends.base import ModelContext
from triton_nb.backends.fil.common import log_once
from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.repository.config import FIL_MODEL_FILENAMES, model_filename


@dataclass
class LoadedModel:
    """One model file, parsed by Treelite and (when possible) by its native library."""

    path: Path
    model_type: str
    file_hash: str
    treelite: Any  # treelite.Model
    num_feature: int
    num_outputs: int  # values per row: 1 (binary, regression) or the number of classes
    xgboost: Any | None = None  # xgboost.Booster that predicts probabilities
    lightgbm: Any | None = None  # lightgbm.Booster


def _describe_load_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    # XGBoost and Treelite prefix messages with "[time] file:line:"; the first line says what failed.
    lines = [line.strip() for line in text if line.strip() and not line.strip().startswith("Stack trace")]
    message = lines[0] if lines else type(exc).__name__
    return re.sub(r"^\[[0-9:]+\]\s+\S+:\d+:\s*", "", message)[:500]


def _other_files_hint(version_dir: Path, model_type: str) -> str:
    """A model_type that does not match the file written is the usual cause of a missing file: name
    the FIL files the folder does hold, and the model_type that loads each."""
    present = [(other, name) for other, name in FIL_MODEL_FILENAMES.items()
               if other != model_type and (version_dir / name).is_file()]
    if not present:
        return ""
    listed = ", ".join(f"'{name}' (model_type '{other}')" for other, name in present)
    return f"; the version folder holds {listed}"


def _sniff_model_type(data: bytes) -> str | None:
    """The model_type a file's first bytes look like, when they say (binary formats mostly do not)."""
    head = data[:4096].lstrip()
    if head.startswith(b"{"):
        rest = head[1:].lstrip()
        if rest[:1] in (b'"', b"}"):
            return "xgboost_json"
        if rest[:1] and rest[:1] in b"UiIlL$#":  # UBJSON: a key's length marker follows the brace
            return "xgboost_ubj"
        return None
    if head.startswith(b"tree\n") or b"\nmax_feature_idx=" in head:
        return "lightgbm"
    return None


def _content_hint(data: bytes, model_type: str) -> str:
    """What a file that fails to load looks like: Treelite's own message for a file in another format
    is often a C++ detail (``basic_string::_M_replace_aux``), and a truncated file names no cause."""
    sniffed = _sniff_model_type(data)
    if sniffed is not None and sniffed != model_type:
        return f" (the file looks like model_type '{sniffed}', not '{model_type}')"
    if sniffed == "xgboost_json" and not data.rstrip().endswith(b"}"):
        return " (the JSON ends before it is complete: is the file truncated?)"
    if not data.strip():
        return " (the file is empty)"
    return ""


def _load_treelite(path: Path, model_type: str, allow_unknown_field: bool) -> Any:
    import treelite

    route_native_logs()

    if model_type == "xgboost_json":
        return treelite.frontend.load_xgboost_model(
            path, format_choice="json", allow_unknown_field=allow_unknown_field
        )
    if model_type == "xgboost_ubj":
        return treelite.frontend.load_xgboost_model(
            path, format_choice="ubjson", allow_unknown_field=allow_unknown_field
        )
    if model_type == "xgboost":
        return treelite.frontend.load_xgboost_model_legacy_binary(path)
    if model_type == "lightgbm":
        return treelite.frontend.load_lightgbm_model(path)
    return treelite.Model.deserialize(path)


def _load_xgboost(data: bytes, path: Path) -> Any | None:
    """The file as an ``xgboost.Booster`` predicting probabilities, or None when XGBoost cannot read
    what Treelite could (the legacy binary format, which XGBoost 3 dropped, or fields this XGBoost
    does not know): Treelite's engines serve it then."""
    import xgboost as xgb

    booster = xgb.Booster()
    try:
        booster.load_model(bytearray(data))
    except (xgb.core.XGBoostError, UnicodeDecodeError) as exc:
        # XGBoost 3 refuses a legacy binary file with a message that quotes the file's first bytes;
        # when those are not UTF-8 (a base_score of 0.3 is 9a 99 99 3e), decoding its own message
        # raises UnicodeDecodeError instead of XGBoostError. Either way Treelite has read the file.
        reason = ("this XGBoost does not read the file's format" if isinstance(exc, UnicodeDecodeError)
                  else _describe_load_error(exc))
        log_once(f"xgb-unreadable:{path}", logging.WARNING, "XGBoost cannot read %s (%s); Treelite serves it",
                  path, reason)
        return None
    if json.loads(booster.save_config())["learner"]["objective"]["name"] == "multi:softmax":
        # FIL (Treelite) answers a multi:softmax model with its class probabilities, as softprob would.
        booster.set_param({"objective": "multi:softprob"})
    return booster


def _model_outputs(tl_model: Any) -> tuple[int, int]:
    """``(num_target, values per row)`` of a Treelite model."""
    header = tl_model.get_header_accessor()
    num_target = int(np.asarray(header.get_field("num_target")).reshape(-1)[0])
    num_class = np.asarray(header.get_field("num_class")).reshape(-1)
    return num_target, int(num_class.max()) if num_class.size else 1


def load_tree_model(context: ModelContext, model_type: str, parameters: dict[str, str]) -> LoadedModel:
    filename = model_filename(context.config) or FIL_MODEL_FILENAMES[model_type]
    path = Path(context.version_path) / filename
    where = f"model '{context.name}' version {context.version}"
    if not path.is_file():
        raise NotFoundError(
            f"{where}: FIL model file '{path}' is missing (model_type '{model_type}' loads '{filename}' "
            f"from the version folder){_other_files_hint(path.parent, model_type)}"
        )
    data = path.read_bytes()

    def invalid(exc: BaseException) -> InvalidArgumentError:
        return InvalidArgumentError(
            f"{where}: cannot load FIL model file '{path}' as model_type '{model_type}': {_describe_load_error(exc)}"
            f"{_content_hint(data, model_type)}"
        )

    try:
        tl_model = _load_treelite(path, model_type, parameters.get("xgboost_allow_unknown_field") == "true")
    except Exception as exc:
        raise invalid(exc) from exc
    num_target, num_outputs = _model_outputs(tl_model)
    if num_target != 1:
        raise InvalidArgumentError(
            f"{where}: '{path}' is a multi-target model ({num_target} targets); FIL serves single-target models"
        )
    loaded = LoadedModel(
        path=path,
        model_type=model_type,
        file_hash=hashlib.sha256(data).hexdigest(),
        treelite=tl_model,
        num_feature=int(tl_model.num_feature),
        num_outputs=num_outputs,
    )
    if model_type.startswith("xgboost"):
        loaded.xgboost = _load_xgboost(data, path)
    elif model_type == "lightgbm" and (lgb := optional_module("lightgbm")) is not None:
        try:
            loaded.lightgbm = lgb.Booster(model_str=data.decode("utf-8", errors="replace"))
        except Exception as exc:  # Treelite read it: its engines serve it
            log_once(f"lgb-unreadable:{path}", logging.WARNING, "LightGBM cannot read %s (%s); Treelite serves it",
                      path, _describe_load_error(exc))
    return loaded
