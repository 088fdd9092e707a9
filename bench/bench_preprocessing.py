"""Preprocessing throughput: triton_nb's FraudPreprocessor vs the example's own approach.

The example's preprocessing model builds a pandas DataFrame from the request tensors on every
call, applies the rules with pandas, and label-encodes with scikit-learn ``LabelEncoder``s.
Both sides here get the same Triton-style inputs (BYTES tensors as object arrays of UTF-8
bytes shaped [batch, 1], FP32 tensors [batch, 1]), produce the same 15 features (checked),
and are timed in the same run, interleaved, so the printed ratios are stable on a noisy
machine even when the absolute times are not.

    python bench/bench_preprocessing.py [--seconds 0.5]

Targets: >= 20x at batch 1-64, >= 3x at 512-4096.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
from sklearn.preprocessing import LabelEncoder

from triton_nb.fraud import (
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    RAW_INPUT_COLUMNS,
    US_STATE_CODES,
    FraudPreprocessor,
    generate_transactions,
    request_tensors,
)
from triton_nb.fraud.features import FP32_INPUTS

BATCH_SIZES = (1, 8, 64, 512, 4096)
TARGETS = {1: 20.0, 8: 20.0, 64: 20.0, 512: 3.0, 4096: 3.0}


def triton_inputs(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The request tensors Triton's Python backend would hand the preprocessing model."""
    return request_tensors(frame)


class ExampleBaseline:
    """The example's approach: a DataFrame per call, pandas rules, sklearn LabelEncoders."""

    def __init__(self, classes: dict[str, np.ndarray]) -> None:
        self.encoders = {}
        for column, values in classes.items():
            encoder = LabelEncoder()
            encoder.classes_ = np.asarray(values, dtype=object)
            self.encoders[column] = encoder
        self.us_or_online = sorted(US_STATE_CODES | {"ONLINE"})

    def __call__(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        df = pd.DataFrame({name: array.ravel() for name, array in inputs.items()})
        for name in RAW_INPUT_COLUMNS:
            if name not in FP32_INPUTS:
                df[name] = df[name].str.decode("utf-8")
        df["Zip"] = df["Zip"].str.replace(r"\.0$", "", regex=True).replace("", "UNKNOWN")
        df["Merchant State"] = df["Merchant State"].replace("", "UNKNOWN")
        df.loc[df["Merchant City"] == "ONLINE", ["Merchant State", "Zip"]] = "ONLINE"
        df.loc[~df["Merchant State"].isin(self.us_or_online), "Zip"] = "FOREIGN"
        df["Errors?"] = (df["Errors?"] != "").astype(np.float32)
        df["Amount"] = df["Amount"].str.replace("$", "", regex=False).astype(float)
        df["Hour"] = df["Time"].str[0:2].astype(int)
        df["Minute"] = df["Time"].str[3:5].astype(int)
        for column in ENCODED_COLUMNS:
            df[column] = self.encoders[column].transform(df[column])
        return df[list(FEATURE_NAMES)].to_numpy(np.float32)


def rows_per_second(function, inputs, batch: int, seconds: float) -> float:
    calls = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        function(inputs)
        calls += 1
        now = time.perf_counter()
        if now >= deadline:
            return calls * batch / (now - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=0.5, help="time per side per round")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best of each side counts")
    args = parser.parse_args()

    training = generate_transactions(100_000, seed=0)
    preprocessor = FraudPreprocessor().fit(training)
    baseline = ExampleBaseline(preprocessor.classes_)
    # The example fails a batch on an unseen category, so serve rows from the training data.
    serving = training.sample(max(BATCH_SIZES), random_state=1)

    print(f"{'batch':>6} {'triton_nb rows/s':>17} {'example rows/s':>15} {'ratio':>7} {'target':>7}")
    for batch in BATCH_SIZES:
        inputs = triton_inputs(serving.head(batch))
        np.testing.assert_array_equal(preprocessor.transform(inputs), baseline(inputs))
        ours = theirs = 0.0
        for _ in range(args.rounds):
            ours = max(ours, rows_per_second(preprocessor.transform, inputs, batch, args.seconds))
            theirs = max(theirs, rows_per_second(baseline, inputs, batch, args.seconds))
        ratio = ours / theirs
        verdict = "ok" if ratio >= TARGETS[batch] else "BELOW"
        print(f"{batch:>6} {ours:>17,.0f} {theirs:>15,.0f} {ratio:>6.1f}x {TARGETS[batch]:>5.0f}x {verdict}")


if __name__ == "__main__":
    main()
