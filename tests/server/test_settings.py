"""The server's options: one validated dataclass, the Server's parameters and `triton-nb serve`'s flags."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

import triton_nb
from triton_nb.cli import _build_parser, main
from triton_nb.cli.serve import _serve_settings
from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.server.core import Server
from triton_nb.server.settings import MODEL_CONTROL_MODES, ServerSettings
from triton_nb.serving import InferenceServer, serve

MiB = 1024 * 1024

# What the README and the parameters' documentation promise.
DOCUMENTED_DEFAULTS = {
    "model_control_mode": "explicit", "load_models": ("*",), "repository_poll_secs": 15.0,
    "http_port": None, "grpc_port": None, "metrics_port": None,
    "http_address": "127.0.0.1", "grpc_address": "127.0.0.1", "metrics_address": "127.0.0.1",
    "max_request_bytes": 64 * MiB, "max_tensor_elements": 16 * MiB, "grpc_max_message_bytes": 64 * MiB,
    "exit_timeout_secs": 30.0, "http_read_timeout_secs": 60.0, "http_timeout_keep_alive_secs": 75.0,
    "http_restricted_api": (), "grpc_restricted_api": (), "max_pending_requests": 65536,
    "max_string_bytes": MiB, "network_model_control": False, "disable_auto_complete_config": False,
    "freeze_gc": True, "cache_size_bytes": None,
    "rate_limit": "off", "rate_limit_resources": (), "backend_directory": None, "python_instances": "thread",
    "metrics_config": (), "cpu_metrics": True, "server_id": "triton_nb", "allow_sagemaker": False,
    "sagemaker_port": 8080, "exit_on_error": False,
    "strict_readiness": True, "model_load_thread_count": 1, "model_load_retry_count": 0, "log_verbose": 0,
    "log_info": True, "log_warning": True, "log_error": True, "log_format": "default", "log_file": None,
    "backend_config": (),
}
# tritonserver's defaults, where `triton-nb serve` takes them instead of the in-process ones
TRITONSERVER_DEFAULTS = {"http_port": 8000, "grpc_port": 8001, "metrics_port": 8002, "model_control_mode": "none",
                         "exit_on_error": True, "model_load_thread_count": 4}

FIELDS = dataclasses.fields(ServerSettings)


def test_the_defaults_are_the_documented_ones():
    assert dataclasses.asdict(ServerSettings()) == DOCUMENTED_DEFAULTS
    assert MODEL_CONTROL_MODES == ("none", "explicit", "poll")


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_every_setting_is_documented_where_it_is_declared(field):
    assert len(field.metadata["help"]) > 20
    assert field.metadata["flag"] or field.metadata["cli"], "a setting without a flag says why"
    # the Server's parameters are the settings' own documentation, default included
    assert f"{field.name} : {field.type}, default {field.default!r}" in (Server.__doc__ or "")
    assert field.name in (InferenceServer.__doc__ or "")


BAD_VALUES = [
    ("model_control_mode", "sometimes", r"model_control_mode must be one of none, explicit, poll, got 'sometimes'"),
    ("load_models", 7, r"load_models must be a string or a list of strings, got 7"),
    ("repository_poll_secs", 0, r"repository_poll_secs must be > 0, got 0"),
    ("http_port", 70000, r"http_port must be a port number 0\.\.65535 \(0 picks a free one\), got 70000"),
    ("grpc_port", True, r"grpc_port must be a port number .*, got True"),
    ("metrics_port", "8002", r"metrics_port must be a port number .*, got '8002'"),
    ("sagemaker_port", -1, r"sagemaker_port must be a port number .*, got -1"),
    ("http_address", "", r"http_address must be an interface address, got ''"),
    ("grpc_address", None, r"grpc_address must be an interface address, got None"),
    ("metrics_address", 0, r"metrics_address must be an interface address, got 0"),
    ("max_request_bytes", 0, r"max_request_bytes must be >= 1, got 0"),
    ("max_tensor_elements", -1, r"max_tensor_elements must be >= 1, got -1"),
    ("grpc_max_message_bytes", 0, r"grpc_max_message_bytes must be >= 1, got 0"),
    ("exit_timeout_secs", -1.0, r"exit_timeout_secs must be >= 0, got -1\.0"),
    ("http_read_timeout_secs", float("inf"), r"http_read_timeout_secs must be a number of seconds > 0, got inf"),
    ("http_timeout_keep_alive_secs", 0, r"http_timeout_keep_alive_secs must be a number of seconds > 0, got 0"),
    ("http_restricted_api", "nonsense", r"http_restricted_api must be <group>.*, got 'nonsense'"),
    ("grpc_restricted_api", ["everything:k=v"], r"grpc_restricted_api: unknown API group 'everything'"),
    ("max_pending_requests", 0, r"max_pending_requests must be >= 1, got 0"),
    ("max_string_bytes", 0, r"max_string_bytes must be >= 1, got 0"),
    ("cache_size_bytes", -1, r"cache_size_bytes must be >= 0, got -1"),
    ("rate_limit", "fast", r"rate_limit must be one of off, execution_count, got 'fast'"),
    ("rate_limit_resources", ["R:1"], r"rate_limit_resources need rate_limit='execution_count'"),
    ("python_instances", "fiber", r"python_instances must be one of thread, process, got 'fiber'"),
    ("metrics_config", ["nope=1"], r"unknown setting 'nope'"),
    ("server_id", "", r"server_id must be a non-empty string, got ''"),
    ("model_load_thread_count", 0, r"model_load_thread_count must be a whole number >= 1, got 0"),
    ("model_load_retry_count", -1, r"model_load_retry_count must be a whole number >= 0, got -1"),
    ("log_verbose", True, r"log_verbose must be a whole number >= 0, got True"),
    ("log_format", "json", r"log_format must be one of default, ISO8601, got 'json'"),
    ("backend_config", ["python"], r"--backend-config must be <backend>,<setting>=<value>.*got 'python'"),
]


@pytest.mark.parametrize(("name", "value", "message"), BAD_VALUES, ids=[f"{n}={v!r}" for n, v, _ in BAD_VALUES])
def test_a_bad_value_is_refused_naming_its_field(name, value, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ServerSettings(**{name: value})


def test_every_setting_has_a_refusal_test_or_takes_any_value_of_its_type():
    # coerced with bool(), as before
    takes_anything = {"network_model_control", "disable_auto_complete_config", "freeze_gc", "cpu_metrics",
                      "exit_on_error", "strict_readiness", "log_info", "log_warning", "log_error", "log_file",
                      "allow_sagemaker"}
    checked = {name for name, _, _ in BAD_VALUES} | {"backend_directory"}
    assert {f.name for f in FIELDS} - checked == takes_anything


def test_a_missing_backend_directory_is_not_found(tmp_path):
    with pytest.raises(NotFoundError, match=r"backend_directory .*missing does not exist or is not a folder"):
        ServerSettings(backend_directory=tmp_path / "missing")


def test_what_it_holds_is_normalized_and_immutable(tmp_path):
    settings = ServerSettings(load_models="a", http_restricted_api=["health:k=v"], backend_directory=str(tmp_path),
                              rate_limit="execution_count", rate_limit_resources=["R:2"], metrics_config=None,
                              cache_size_bytes=1024, freeze_gc=0)
    assert settings.load_models == ("a",)
    assert settings.http_restricted_api == ("health:k=v",)
    assert settings.backend_directory == tmp_path
    assert settings.rate_limit_resources == ("R:2",)
    assert settings.metrics_config == ()
    assert settings.freeze_gc is False
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.http_port = 1  # type: ignore[misc]
    changed = dataclasses.replace(settings, load_models=["a", "b"])
    assert changed.load_models == ("a", "b") and changed.cache_size_bytes == 1024
    assert ServerSettings(load_models=[]).load_models == ()  # explicit mode, nothing loaded at start


def test_an_unknown_option_is_a_type_error_naming_it(repo):
    for make in (Server, InferenceServer, serve):
        with pytest.raises(TypeError, match=r"unknown server option\(s\) 'htpp_port' \(did you mean 'http_port'\?\)"):
            make(repo, htpp_port=0)
    with pytest.raises(TypeError, match=r"'colour'"):
        ServerSettings.from_options(ServerSettings(), colour="blue")


def test_the_server_runs_with_its_settings_and_options_override_them(repo):
    server = Server(repo, ServerSettings(max_pending_requests=3, freeze_gc=False), max_string_bytes=10)
    try:
        assert server.settings == ServerSettings(max_pending_requests=3, freeze_gc=False, max_string_bytes=10)
        assert server.model_control_mode == "explicit"
    finally:
        server.stop()
    with serve(repo, model_control_mode="none", freeze_gc=False) as running:
        assert running.settings.model_control_mode == running.model_control_mode == "none"
        assert running.is_model_ready("scale")
    assert triton_nb.ServerSettings is ServerSettings and "ServerSettings" in triton_nb.__all__


def _serve_parser() -> argparse.ArgumentParser:
    commands = next(a for a in _build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["serve"]


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_every_setting_has_a_serve_flag_with_its_default_or_says_why_not(field):
    flag = field.metadata["flag"]
    if flag is None:
        assert field.metadata["cli"], f"{field.name} has no flag and no reason"
        return
    action = next(a for a in _serve_parser()._actions if flag in a.option_strings)
    assert action.dest == field.name
    assert field.metadata["help"].split()[0] in action.help
    if "choices" in field.metadata:
        assert tuple(action.choices) == field.metadata["choices"]
    if field.metadata.get("repeat"):
        assert action.default is None  # an absent flag leaves the setting's default (argparse would append to a list)
    else:
        assert action.default == TRITONSERVER_DEFAULTS.get(field.name, field.default)


def test_a_bare_serve_command_line_gives_the_settings_defaults(tmp_path):
    args = _serve_parser().parse_args(["--model-repository", str(tmp_path)])
    assert _serve_settings(args) == ServerSettings(**TRITONSERVER_DEFAULTS)


def test_the_serve_flags_that_set_more_than_their_own_field(tmp_path):
    def settings(*flags: str) -> ServerSettings:
        return _serve_settings(_serve_parser().parse_args(["--model-repository", str(tmp_path), *flags]))

    assert settings("--allow-grpc=false", "--allow-metrics=false", "--allow-cpu-metrics=true") == ServerSettings(
        **{**TRITONSERVER_DEFAULTS, "grpc_port": None, "metrics_port": None, "cpu_metrics": False})
    explicit = settings("--model-control-mode=explicit", "--load-model", "a", "--load-model", "b",
                        "--max-request-bytes", "1_000", "--cache-config", "local,size=4096")
    assert explicit.network_model_control and explicit.load_models == ("a", "b")
    assert explicit.max_request_bytes == explicit.grpc_max_message_bytes == 1000
    assert explicit.cache_size_bytes == 4096


def test_serve_names_a_bad_setting_before_it_starts(tmp_path, capsys):
    assert main(["serve", "--model-repository", str(tmp_path), "--repository-poll-secs", "0"]) == 2
    assert "triton-nb serve: error: repository_poll_secs must be > 0, got 0.0" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--load-model", "a"]) == 2
    assert "--load-model needs --model-control-mode=explicit" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--allow-http=false", "--allow-grpc=off"]) == 2
    assert "at least one of HTTP, gRPC and SageMaker must be allowed" in capsys.readouterr().err
    assert main(["serve", "--model-repository", str(tmp_path), "--backend-directory", str(Path(tmp_path, "x"))]) == 2
    assert "does not exist or is not a folder" in capsys.readouterr().err
