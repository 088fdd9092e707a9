"""A Python model without ``config.pbtxt`` against real Triton: a folder holding only
``1/model.py`` is served as a Python model that its ``auto_complete_config`` describes, the same
answers over in-process, HTTP and gRPC calls and the same completed config on both servers; with
``--disable-auto-complete-config`` the folder is refused with Triton's words, the repository index
lists it without a state, and a model's ``auto_complete_config`` is not called."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import triton_nb
from tests.helpers.real_triton import RealTritonServer, tritonserver_unavailable_reason
from triton_nb.cli import _build_parser
from triton_nb.cli.serve import _serve_settings
from triton_nb.errors import NotFoundError

X = np.arange(8, dtype=np.float32).reshape(2, 4)

MODEL_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        auto_complete_model_config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]})
        auto_complete_model_config.set_max_batch_size(8)
        return auto_complete_model_config

    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
                    "OUTPUT0", 2 * pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy())])
                for request in requests]
'''

SERVERS = ["triton_nb", pytest.param("real_triton", marks=pytest.mark.real_triton)]


def _repository(root: Path) -> Path:
    """``auto/1/model.py`` and nothing else, as python_backend's auto_complete example is served."""
    (root / "repo" / "auto" / "1").mkdir(parents=True)
    (root / "repo" / "auto" / "1" / "model.py").write_text(MODEL_PY)
    return root / "repo"


def _index(http_url: str) -> list[dict]:
    request = urllib.request.Request(f"http://{http_url}/v2/repository/index", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def _observe(http_url: str, grpc_url: str) -> dict:
    seen: dict = {"index": _index(http_url)}
    for protocol, tc in (("http", httpclient), ("grpc", grpcclient)):
        client = tc.InferenceServerClient(http_url if protocol == "http" else grpc_url)
        tensor = tc.InferInput("INPUT0", list(X.shape), "FP32")
        tensor.set_data_from_numpy(X)
        seen[protocol] = client.infer("auto", [tensor]).as_numpy("OUTPUT0").tolist()
        client.close()
    config = httpclient.InferenceServerClient(http_url).get_model_config("auto")
    seen["config"] = (config["backend"], config["max_batch_size"],
                      [(t["name"], t["data_type"], t["dims"]) for t in config["input"]],
                      [(t["name"], t["data_type"], t["dims"]) for t in config["output"]])
    return seen


def _real_triton(repo: Path, *extra: str) -> RealTritonServer:
    reason = tritonserver_unavailable_reason()
    if reason is not None:
        pytest.fail(f"real tritonserver unavailable: {reason}", pytrace=False)
    return RealTritonServer(repo, extra_args=extra)


@pytest.mark.parametrize("server", SERVERS)
def test_a_python_model_without_a_config_is_served_as_its_auto_complete_config_says(tmp_path, server):
    repo = _repository(tmp_path)
    if server == "real_triton":
        with _real_triton(repo) as real:
            seen = _observe(real.http_url, real.grpc_url)
    else:
        with triton_nb.serve(repo, http_port=0, grpc_port=0) as ours:
            seen = _observe(ours.endpoints["http"], ours.endpoints["grpc"])
            np.testing.assert_array_equal(ours.client().infer("auto", {"INPUT0": X}).as_numpy("OUTPUT0"), 2 * X)
        assert triton_nb.repository.validate_repository(repo) == []
    assert seen["index"] == [{"name": "auto", "version": "1", "state": "READY"}]
    assert seen["http"] == seen["grpc"] == (2 * X).tolist()
    assert seen["config"] == ("python", 8, [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])])


@pytest.mark.parametrize("server", SERVERS)
def test_with_auto_complete_disabled_a_folder_without_a_config_is_refused_in_tritons_words(tmp_path, server):
    repo = _repository(tmp_path)
    expected = (f"Poll failed for model directory 'auto': failed to open text file for read "
                f"{repo.resolve() / 'auto' / 'config.pbtxt'}: No such file or directory")
    if server == "real_triton":
        with _real_triton(repo, "--disable-auto-complete-config", "--exit-on-error=false",
                          "--strict-readiness=false") as real:
            index = _index(real.http_url)
            assert expected in real.log_tail(200)
    else:
        with triton_nb.serve(repo.resolve(), http_port=0, disable_auto_complete_config=True) as ours:
            index = _index(ours.endpoints["http"])
            with pytest.raises(NotFoundError, match=f"^{expected}$"):
                ours.load_model("auto")
    assert index == [{"name": "auto"}]  # listed, never loaded


@pytest.mark.parametrize("server", SERVERS)
def test_with_auto_complete_disabled_a_models_auto_complete_config_is_not_called(tmp_path, server):
    repo = _repository(tmp_path)
    (repo / "auto" / "config.pbtxt").write_text('backend: "python"\n')

    def config(http_url: str) -> tuple:
        answer = httpclient.InferenceServerClient(http_url).get_model_config("auto")
        return answer.get("max_batch_size", 0), len(answer.get("input", []))

    if server == "real_triton":
        with _real_triton(repo) as completed:
            seen = config(completed.http_url)
        with _real_triton(repo, "--disable-auto-complete-config") as plain:
            seen += config(plain.http_url)
    else:
        with triton_nb.serve(repo, http_port=0) as completed:
            seen = config(completed.endpoints["http"])
        with triton_nb.serve(repo, http_port=0, disable_auto_complete_config=True) as plain:
            seen += config(plain.endpoints["http"])
    assert seen == (8, 1, 0, 0)  # completed: max_batch_size 8 and INPUT0; as written: neither


def test_triton_nb_serve_takes_tritonservers_flag_without_a_value():
    parse = _build_parser().parse_args
    assert _serve_settings(parse(["serve", "--model-repository", "r", "--disable-auto-complete-config"])
                           ).disable_auto_complete_config is True
    assert _serve_settings(parse(["serve", "--model-repository", "r"])).disable_auto_complete_config is False
