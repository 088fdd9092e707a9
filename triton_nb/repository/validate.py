"""Validating a whole repository the way Triton checks it when loading.

Per-model rules live in :func:`triton_nb.repository.config.check_model_config`; this module adds
what needs the repository around a model: version folders and the files the backend loads, and
for ensembles the rules across models — every step model exists, every input of a step model is
mapped exactly once, every ensemble output is written once, data types and shapes agree along
each edge, the steps form no cycle, and the ensemble's max_batch_size is not above any
composing model's. Warm-up samples are checked by :func:`triton_nb.repository.warmup.check_warmup`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tritonclient.grpc import model_config_pb2 as mc

from triton_nb.repository.config import (
    CONFIG_FILENAME,
    ModelConfig,
    Problem,
    check_model_config,
    is_ensemble,
    model_filename,
)
from triton_nb.repository.layout import ModelEntry, RepositoryScan, scan_repository
from triton_nb.repository.sequence_state import check_sequence_state
from triton_nb.repository.warmup import check_warmup

__all__ = ["errors_only", "validate_repository"]


def errors_only(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def validate_repository(path: str | os.PathLike[str]) -> list[Problem]:
    """Every problem found in the repository at ``path``; an empty list means Triton would load it."""
    scan = scan_repository(path)
    problems: list[Problem] = []
    for entry in scan.models.values():
        problems.extend(_check_entry(entry))
        if entry.config is not None and is_ensemble(entry.config):
            problems.extend(check_ensemble(entry, scan))
    return problems


def _check_entry(entry: ModelEntry) -> list[Problem]:
    if entry.config is None:
        return [Problem(entry.name, CONFIG_FILENAME, "", entry.error or "missing")]
    problems = check_model_config(entry.config, entry.name)
    problems.extend(check_warmup(entry.config, entry.name, entry.path))  # samples and their files
    problems.extend(check_sequence_state(entry.config, entry.name, entry.path))  # initial state files
    for name in entry.ignored:
        problems.append(Problem(entry.name, f"{name}/", "", "not a numeric version folder; Triton ignores it",
                                "warning"))
    if not entry.versions:
        problems.append(Problem(entry.name, "", "version", "no numeric version folder (for example '1/')"))
        return problems
    selected = entry.selected_versions
    if not selected:
        problems.append(Problem(entry.name, CONFIG_FILENAME, "version_policy",
                                f"no available version ({entry.versions}) matches the policy"))
    policy = entry.config.version_policy
    if policy.WhichOneof("policy_choice") == "specific":
        for version in policy.specific.versions:
            if version not in entry.versions:
                problems.append(Problem(entry.name, CONFIG_FILENAME, "version_policy.specific",
                                        f"version {version} has no folder", "warning"))
    filename = model_filename(entry.config)
    for version in selected:
        if filename and not (entry.version_path(version) / filename).exists():
            problems.append(Problem(entry.name, f"{version}/{filename}", "",
                                    f"missing: the {entry.config.backend or entry.config.platform} backend "
                                    f"loads '{filename}' from each version folder"))
    return problems


@dataclass(frozen=True)
class _Tensor:
    data_type: int
    dims: tuple[int, ...]
    origin: str  # for messages: where this tensor is declared


def _tensors(tensors: object, origin: str) -> dict[str, _Tensor]:
    return {t.name: _Tensor(t.data_type, tuple(t.dims), f"{origin} '{t.name}'") for t in tensors}


def _dims_agree(left: tuple[int, ...], right: tuple[int, ...]) -> bool:
    return len(left) == len(right) and all(a == b or -1 in (a, b) for a, b in zip(left, right, strict=True))


def _type_name(data_type: int) -> str:
    return mc.DataType.Name(data_type)


def check_ensemble(entry: ModelEntry, scan: RepositoryScan) -> list[Problem]:
    config: ModelConfig = entry.config
    name = entry.name
    problems: list[Problem] = []

    def problem(field: str, message: str, severity: str = "error") -> None:
        problems.append(Problem(name, CONFIG_FILENAME, field, message, severity))

    ensemble_inputs = _tensors(config.input, "ensemble input")
    ensemble_outputs = _tensors(config.output, "ensemble output")
    produced: dict[str, tuple[int, _Tensor]] = {}  # ensemble tensor -> (step, declared tensor)
    consumed: dict[str, list[tuple[int, _Tensor]]] = {}
    for index, step in enumerate(config.ensemble_scheduling.step):
        where = f"ensemble_scheduling.step[{index}]"
        composing = scan.models.get(step.model_name)
        if composing is None:
            problem(f"{where}.model_name", f"model '{step.model_name}' is not in the repository")
            continue
        if composing.config is None:
            problem(f"{where}.model_name", f"model '{step.model_name}' has no valid configuration")
            continue
        if step.model_version not in (-1, 0) and step.model_version not in composing.versions:
            problem(f"{where}.model_version", f"model '{step.model_name}' has no version {step.model_version}")
        step_config = composing.config
        step_inputs = _tensors(step_config.input, f"input of '{step.model_name}'")
        step_outputs = _tensors(step_config.output, f"output of '{step.model_name}'")
        for model_input in step_inputs:
            if model_input not in step.input_map:
                problem(f"{where}.input_map", f"input '{model_input}' of model '{step.model_name}' is not mapped")
        for model_input, tensor in step.input_map.items():
            if model_input not in step_inputs:
                problem(f"{where}.input_map", f"model '{step.model_name}' has no input '{model_input}'")
                continue
            consumed.setdefault(tensor, []).append((index, step_inputs[model_input]))
        for model_output, tensor in step.output_map.items():
            if model_output not in step_outputs:
                problem(f"{where}.output_map", f"model '{step.model_name}' has no output '{model_output}'")
                continue
            if tensor in produced or tensor in ensemble_inputs:
                problem(f"{where}.output_map", f"ensemble tensor '{tensor}' is written more than once")
                continue
            produced[tensor] = (index, step_outputs[model_output])
        if config.max_batch_size > 0:
            if step_config.max_batch_size == 0:
                problem("max_batch_size", f"the ensemble batches ({config.max_batch_size}) but model "
                        f"'{step.model_name}' does not (max_batch_size 0)")
            elif config.max_batch_size > step_config.max_batch_size:
                problem("max_batch_size", f"{config.max_batch_size} is above the max_batch_size "
                        f"{step_config.max_batch_size} of model '{step.model_name}'")

    def source(tensor: str) -> _Tensor | None:
        if tensor in ensemble_inputs:
            return ensemble_inputs[tensor]
        return produced[tensor][1] if tensor in produced else None

    for tensor, uses in consumed.items():
        origin = source(tensor)
        if origin is None:
            problem("ensemble_scheduling", f"tensor '{tensor}' is read by step {uses[0][0]} but no ensemble input "
                    "or step output provides it")
            continue
        for index, target in uses:
            problems.extend(_edge_problems(name, f"ensemble_scheduling.step[{index}].input_map", origin, target))
    for output, target in ensemble_outputs.items():
        if output not in produced:
            problem("output", f"ensemble output '{output}' is not written by any step")
        else:
            problems.extend(_edge_problems(name, "output", produced[output][1], target))
    for tensor in ensemble_inputs:
        if tensor not in consumed:
            problem("input", f"ensemble input '{tensor}' is not used by any step", "warning")
    if _has_cycle(config, produced):
        problem("ensemble_scheduling", "the steps form a cycle")
    return problems


def _edge_problems(model: str, field: str, origin: _Tensor, target: _Tensor) -> list[Problem]:
    problems = []
    if origin.data_type != target.data_type:
        problems.append(Problem(model, CONFIG_FILENAME, field,
                                f"{origin.origin} is {_type_name(origin.data_type)} but {target.origin} is "
                                f"{_type_name(target.data_type)}"))
    if not _dims_agree(origin.dims, target.dims):
        problems.append(Problem(model, CONFIG_FILENAME, field,
                                f"{origin.origin} has dims {list(origin.dims)} but {target.origin} has "
                                f"{list(target.dims)}"))
    return problems


def _has_cycle(config: ModelConfig, produced: dict[str, tuple[int, _Tensor]]) -> bool:
    steps = config.ensemble_scheduling.step
    depends = {i: {produced[t][0] for t in step.input_map.values() if t in produced} for i, step in enumerate(steps)}
    state: dict[int, int] = {}  # 1 visiting, 2 done

    def visit(node: int) -> bool:
        if state.get(node) == 1:
            return True
        if state.get(node) == 2:
            return False
        state[node] = 1
        if any(visit(dep) for dep in depends[node]):
            return True
        state[node] = 2
        return False

    return any(visit(node) for node in depends)
