"""The AWS sample's boto3 client code, unchanged, against the notebook's SageMaker endpoint.

The sample deploys the fraud ensemble to a multi-model SageMaker endpoint and calls it with
``invoke_endpoint(..., TargetModel="model-cpu.tar.gz")``, once with binary+json and once with a
JSON body. Here the endpoint is ``triton_nb.serve(..., allow_sagemaker=True)`` over a folder
holding the archive ``package_for_sagemaker`` wrote (the endpoint's S3 prefix); boto3 reaches it
through ``endpoint_url=`` with placeholder credentials.
"""

from __future__ import annotations

import json
from pathlib import Path

import boto3
import numpy as np
import pytest
import tritonclient.http as httpclient
from botocore.config import Config

import triton_nb
from triton_nb import fraud
from triton_nb.repository import export_fraud_repository
from triton_nb.repository.sagemaker import package_for_sagemaker


@pytest.fixture(scope="module")
def endpoint(trained, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("sagemaker-runtime")
    repository = export_fraud_repository(trained, root / "repository")
    models = root / "models"  # the endpoint's S3 prefix
    package_for_sagemaker(repository, models / "model-cpu.tar.gz")
    server = triton_nb.serve(models, allow_sagemaker=True, sagemaker_port=0)
    port = int(server.endpoints["sagemaker"].rsplit(":", 1)[1])
    client = boto3.client("sagemaker-runtime", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1",
                          aws_access_key_id="placeholder", aws_secret_access_key="placeholder",
                          config=Config(retries={"max_attempts": 1}))
    yield client, server
    server.stop()


def _columns(rows) -> dict[str, np.ndarray]:
    return fraud.request_tensors(rows)


def test_the_samples_binary_and_json_calls_run_unchanged(endpoint, fraud_frame, trained) -> None:
    client, server = endpoint
    endpoint_name = "fraud-detection-endpoint"
    rows = fraud_frame.sample(64, random_state=4)
    expected = trained.predict(rows)
    tensors = _columns(rows)

    # binary+json, as the sample builds it with tritonclient
    inputs = []
    for name, array in tensors.items():
        inputs.append(httpclient.InferInput(name, list(array.shape), "FP32" if array.dtype == np.float32 else "BYTES"))
        inputs[-1].set_data_from_numpy(array, binary_data=True)
    outputs = [httpclient.InferRequestedOutput("predictions", binary_data=True)]
    request_body, header_length = httpclient.InferenceServerClient.generate_request_body(inputs, outputs=outputs)
    # --- the sample's call, verbatim ---
    response = client.invoke_endpoint(
        EndpointName=endpoint_name,
        ContentType="application/vnd.sagemaker-triton.binary+json;json-header-size={}".format(header_length),  # noqa: UP032
        Body=request_body,
        TargetModel="model-cpu.tar.gz",
    )
    header_length_prefix = "application/vnd.sagemaker-triton.binary+json;json-header-size="
    header_length_str = response["ContentType"][len(header_length_prefix):]
    result = httpclient.InferenceServerClient.parse_response_body(
        response["Body"].read(), header_length=int(header_length_str))
    # --- end ---
    np.testing.assert_array_equal(result.as_numpy("predictions"), expected)

    # a JSON body with the Content-Type the sample sends it with
    payload = {"inputs": [{"name": name, "shape": list(array.shape),
                           "datatype": "FP32" if array.dtype == np.float32 else "BYTES",
                           "data": [v.decode() if isinstance(v, bytes) else float(v) for v in array.ravel()]}
                          for name, array in tensors.items()]}
    # --- the sample's call, verbatim ---
    response = client.invoke_endpoint(
        EndpointName=endpoint_name, ContentType="application/octet-stream", Body=json.dumps(payload),
        TargetModel="model-cpu.tar.gz"
    )
    predictions = json.loads(response["Body"].read().decode("utf8"))["outputs"][0]["data"]
    # --- end ---
    np.testing.assert_array_equal(predictions, expected)
    assert response["ContentType"] == "application/json"
    # the archive was loaded once, on the first call, under the target's name
    assert server.is_model_ready("model-cpu.tar.gz")


def test_failures_come_back_as_boto3_raises_them(endpoint) -> None:
    client, _ = endpoint
    bad = json.dumps({"inputs": [{"name": "Amount", "shape": [1, 1], "datatype": "BYTES", "data": ["$1.00"]}]})
    with pytest.raises(client.exceptions.ModelError) as raised:
        client.invoke_endpoint(EndpointName="e", ContentType="application/json", Body=bad,
                               TargetModel="model-cpu.tar.gz")
    error = raised.value.response
    assert error["OriginalStatusCode"] == 400 and "'model-cpu.tar.gz'" in error["OriginalMessage"]
    with pytest.raises(client.exceptions.ClientError) as raised:
        client.invoke_endpoint(EndpointName="e", ContentType="application/json", Body=bad,
                               TargetModel="model-gpu.tar.gz")
    assert raised.value.response["Error"]["Code"] == "ValidationError"
    assert "model-gpu.tar.gz" in raised.value.response["Error"]["Message"]


def test_a_target_model_must_be_a_name_in_the_model_data(endpoint, tmp_path: Path) -> None:
    client, _ = endpoint
    for target in ("../repository", "/etc/passwd"):
        with pytest.raises(client.exceptions.ClientError) as raised:
            client.invoke_endpoint(EndpointName="e", ContentType="application/json", Body="{}", TargetModel=target)
        assert raised.value.response["Error"]["Code"] == "ValidationError", target
