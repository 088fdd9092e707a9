"""The preprocessing's two paths — row by row for small batches, whole columns for the rest —
give the same features, and the row path leaves every unusual value to the column path."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from triton_nb.fraud import FraudPreprocessor, encoding, generate_transactions
from triton_nb.fraud.encoding import RAW_INPUT_COLUMNS, FeatureEncoder, FeatureInputError, gather_columns

sys.path.insert(0, str(Path(__file__).parent))
from test_features import as_triton_request, messy_rows, reference


@pytest.fixture(scope="module")
def sample() -> pd.DataFrame:
    return generate_transactions(3000, seed=11, fraud_rate=0.05)


@pytest.fixture(scope="module")
def encoder(sample) -> FeatureEncoder:
    return FeatureEncoder(FraudPreprocessor().fit(sample).classes_)


def both_paths(encoder: FeatureEncoder, data) -> tuple[np.ndarray | None, np.ndarray | BaseException]:
    arrays = gather_columns(data, RAW_INPUT_COLUMNS)
    rows = encoder._rows.transform(arrays)
    try:
        columns: np.ndarray | BaseException = encoder._transform_columns(arrays)
    except FeatureInputError as exc:
        columns = exc
    return rows, columns


def test_plain_triton_rows_take_the_row_path_and_agree_with_the_reference(sample, encoder):
    unseen = generate_transactions(400, seed=99)  # merchants, cities and zips the encoders never saw
    for batch in (unseen.head(1), unseen.iloc[5:13], unseen.iloc[100:132], messy_rows(sample, 32)):
        for request in (as_triton_request(batch), as_triton_request(batch, float_as_int=True)):
            rows, columns = both_paths(encoder, request)
            assert rows is not None, "a plain request fell back to the column path"
            np.testing.assert_array_equal(rows, columns)
            np.testing.assert_array_equal(rows, reference(batch, encoder.classes))


def test_dataframes_of_every_dtype_agree(sample, encoder):
    batch = messy_rows(sample, 20)  # int64 codes, float64 zips with NaN, str and None text
    rows, columns = both_paths(encoder, batch)
    np.testing.assert_array_equal(encoder.transform(batch), columns)
    if rows is not None:
        np.testing.assert_array_equal(rows, columns)
    strings = batch.astype({"Merchant Name": str, "MCC": str}).fillna({"Use Chip": ""})
    rows, columns = both_paths(encoder, strings)
    assert rows is not None
    np.testing.assert_array_equal(rows, columns)


def test_only_small_batches_take_the_row_path(sample, encoder, monkeypatch):
    taken: list[int] = []
    row_transform = encoder._rows.transform

    def spy(arrays):
        taken.append(len(arrays["User"]))
        return row_transform(arrays)

    monkeypatch.setattr(encoder._rows, "transform", spy)
    limit = encoding._ROW_PATH_MAX_ROWS
    for rows in (1, limit, limit + 1, 300):
        encoder.transform(as_triton_request(sample.head(rows)))
    assert taken == [1, limit]


# tricky spellings of every kind, and plain ones; objects as Triton and DataFrames hand them over
TEXT = [
    b"", b" ", b"nan", b"NaN", b"None", b"null", b"<NA>", b"UNKNOWN", b"ONLINE", b" ONLINE ", b"CA", b"Atlantis",
    b"91754", b"91754.0", b"091754", b"91754.5", b"-0", b"-00", b"0", b"-5411", b"5411", b"5411.00", b"1e3",
    b"Z\xc3\xbcrich", b"\xff\xfe", b"a\x00", b"Swipe Transaction", b"  Chip Transaction", b"Monterey Park",
    "Zürich", "ONLINE", "5411", None, 5411, 91754.0, float("nan"), 1.5, True,
]
AMOUNT = [b"$134.09", b"$-64.00", b"134", b" $12. ", b"$1,200.00", b"$1_000", b"$inf", b"$nan", b"", b"twelve",
          b"$0x10", "$5.00", 12.5, None]
TIME = [b"06:21", b"6:21", b" 06:21 ", b"06:21:59", b"24:00", b"12:60", b"1230", b"", b"ab:cd", b"06:2", b"06:21x",
        "23:59", None, 12]
NUMBER = [7.0, 0.0, -3.0, 2019.0, float("nan"), float("inf")]


def test_the_row_path_answers_as_the_column_path_or_leaves_it_the_row(sample, encoder):
    rng = np.random.default_rng(0)
    plain = as_triton_request(generate_transactions(4000, seed=5))
    taken = fell_back = 0
    for _ in range(3000):
        rows = int(rng.integers(1, 5))
        start = int(rng.integers(0, 4000 - rows))
        request = {name: values[start:start + rows].copy() for name, values in plain.items()}
        # spoil a few values of a plain request, each with one of the tricky spellings of its kind
        for _ in range(int(rng.integers(0, 3))):
            name = RAW_INPUT_COLUMNS[int(rng.integers(len(RAW_INPUT_COLUMNS)))]
            row = int(rng.integers(rows))
            pool = (NUMBER if name in ("User", "Card", "Year", "Month", "Day") else
                    TIME if name == "Time" else AMOUNT if name == "Amount" else TEXT)
            request[name][row, 0] = pool[int(rng.integers(len(pool)))]
        by_rows, by_columns = both_paths(encoder, request)
        if by_rows is None:
            fell_back += 1  # the column path decides (its features or its error): what transform returns
            continue
        taken += 1
        assert not isinstance(by_columns, BaseException), by_columns  # the row path took what the column path refused
        np.testing.assert_array_equal(by_rows, by_columns)
    assert taken > 1000 and fell_back > 200, (taken, fell_back)  # both sides of the question were asked


SPELLINGS = [b"5411", b"-5411", b"0", b"-0", b"00", b"007", b"5411.0", b"5411.00", b"0.0", b"-0.0", b"-", b".0",
             b"5.0.0",
             b"54a1", b"54 11", b" 5411", b"5411 ", b"\t5411", b"5411\n", b"-5411.0", b"--5", b"5-4", b"1e3", b"+5",
             b"Monterey Park", b" Monterey Park", b"Z\xc3\xbcrich", b"\xff", b"a\x00b", b"ONLINE", b"nAn", b"x",
             b"12345678901234567890123", b"UNKNOWN"]


@pytest.mark.parametrize("integer", [True, False], ids=["integer column", "text column"])
def test_a_value_judged_canonical_is_left_as_it_is_by_the_rules(integer):
    column = "Zip" if integer else "Merchant City"
    raw = np.array(SPELLINGS, dtype="S")
    judged = encoding._already_canonical(raw, integer=integer)
    for value, plain in zip(SPELLINGS, judged.tolist(), strict=True):
        try:
            canonical = encoding._canonical_bytes(np.array([value], dtype="S"), column, b"UNKNOWN")[0]
        except FeatureInputError:
            assert not plain, value  # invalid UTF-8 is for the rules to refuse
            continue
        expected = value.removesuffix(b".0") if integer and plain else value
        if plain:
            assert canonical == expected, value
    expected_plain = ({b"5411", b"-5411", b"0", b"5411.0", b"0.0", b"-5411.0", b"12345678901234567890123"}
                      if integer else
                      {v for v in SPELLINGS if v.isascii() and v == v.strip() and b"\x00" not in v and v})
    assert {v for v, plain in zip(SPELLINGS, judged.tolist(), strict=True) if plain} == expected_plain
