"""Triton FIL backend output semantics, as plain numpy.

The FIL backend's ``output__0`` depends on three parameters (all strings in ``config.pbtxt``):

* ``output_class "false"`` — a regressor: the prediction itself, dims ``[1]``;
* ``output_class "true"`` and ``predict_proba "false"`` — the class: for a binary classifier
  ``1.0`` only when ``p > threshold`` (p is P(class 1)), for a multiclass one the argmax; dims ``[1]``;
* ``predict_proba "true"`` — probabilities: a binary classifier gives dims ``[1]`` (P(class 1))
  or ``[2]`` (``1 - p, p``), a multiclass one ``[num_classes]``.

The answer's shape is not the configured one: the FIL backend builds its state with rapids-triton's
``squeeze_output``, which puts the batch dim in front and then drops every dim of size 1
(:func:`answer_row_dims`). So ``dims: [1]`` answers ``[rows]``, ``dims: [2]`` ``[rows, 2]``.

Since release 25.09 the FIL backend also accepts ``is_classifier`` for ``output_class``. SHAP
values are not a parameter: declaring an output named ``treeshap_output`` asks for them.

This module turns a model's raw predictions into that output. It depends on numpy alone so the
Python-backend twin of a FIL model (for Triton deployments without the FIL backend) can ship it
beside its ``model.py`` and give the same answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["FilSettings", "answer_row_dims", "fil_output"]

_MODEL_TYPES = ("xgboost", "xgboost_json", "xgboost_ubj", "lightgbm", "treelite_checkpoint")


def answer_row_dims(dims: Sequence[int]) -> tuple[int, ...]:
    """The dims of one row of a FIL answer, from the output's configured ``dims``.

    rapids-triton's ``squeeze_output``, which the FIL backend turns on "to handle a bad choice of
    convention in the original FIL backend", puts a batch dim in front unless the dims already
    start with -1, then erases every dim of size 1: ``[1]`` -> ``()`` (answers ``[rows]``),
    ``[2]`` -> ``(2,)``, ``[1, 2]`` -> ``(2,)``, ``[-1]`` -> ``()``.

    A variable dim left after the batch dim raises ValueError in FIL's words: FIL asks for its
    outputs by the configured shape, so it cannot size such a buffer.
    """
    shape = [int(d) for d in dims]
    if not shape or shape[0] != -1:
        shape.insert(0, -1)
    row = tuple(d for d in shape[1:] if d != 1)
    if any(d < 0 for d in row):
        raise ValueError(f"dims {list(dims)}: Backends with variable-shape outputs must request desired output "
                         f"shape (FIL sizes its answer from the configured dims; only a leading -1 is allowed)")
    return row


def _flag(parameters: Mapping[str, str], name: str, default: str) -> bool:
    value = parameters.get(name, default)
    if value not in ("true", "false"):
        raise ValueError(f"parameter '{name}' must be 'true' or 'false', got '{value}'")
    return value == "true"


@dataclass(frozen=True)
class FilSettings:
    """The FIL parameters that shape ``output__0`` (and the SHAP output)."""

    model_type: str
    output_class: bool
    predict_proba: bool = False
    threshold: float = 0.5
    treeshap_output: bool = False

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str], output_names: Iterable[str] = ()) -> FilSettings:
        """Read the string parameters (and output names) of a FIL ``config.pbtxt``; bad values
        raise ValueError."""
        model_type = parameters.get("model_type", "xgboost")  # FIL's default: the legacy binary format
        if model_type not in _MODEL_TYPES:
            raise ValueError(f"parameter 'model_type' must be one of {', '.join(_MODEL_TYPES)}, got '{model_type}'")
        classifier_key = "is_classifier" if "is_classifier" in parameters else "output_class"
        if classifier_key not in parameters:
            raise ValueError("Required parameter output_class not found in config (or is_classifier, FIL 25.09 "
                             "and later; 'true' for a classifier)")
        output_class = _flag(parameters, classifier_key, "false")
        try:
            threshold = float(parameters.get("threshold", "0.5"))
        except ValueError:
            raise ValueError(f"parameter 'threshold' must be a number, got '{parameters['threshold']}'") from None
        return cls(
            model_type=model_type,
            output_class=output_class,
            predict_proba=_flag(parameters, "predict_proba", "false"),
            threshold=threshold,
            treeshap_output="treeshap_output" in output_names,
        )


def fil_output(predictions: np.ndarray, settings: FilSettings, proba_width: int = 1) -> np.ndarray:
    """``output__0`` for a batch, from the model's predictions.

    ``predictions`` are what the model's own predict gives: values ``(n,)`` for a regressor,
    P(class 1) ``(n,)`` for a binary classifier, probabilities ``(n, k)`` for a multiclass one.
    ``proba_width`` is the last dim of ``output__0`` with ``predict_proba`` for a binary model
    (1 or 2). The result is float32, ``(n, width)``.
    """
    predictions = np.asarray(predictions, dtype=np.float32)
    if not settings.output_class:
        return predictions.reshape(predictions.shape[0], -1)
    if predictions.ndim == 2 and predictions.shape[1] > 1:  # multiclass probabilities
        if settings.predict_proba:
            return predictions
        return np.argmax(predictions, axis=1).astype(np.float32)[:, None]
    positive = predictions.reshape(-1)
    if settings.predict_proba:
        return np.column_stack((1.0 - positive, positive)) if proba_width == 2 else positive[:, None]
    return (positive > settings.threshold).astype(np.float32)[:, None]
