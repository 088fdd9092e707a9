"""Tests of triton_nb.fraud.data: the synthetic TabFormer generator and the CSV reader/writer."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import roc_auc_score

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.fraud.data import (
    LABEL_COLUMN,
    RAW_INPUT_COLUMNS,
    TABFORMER_COLUMNS,
    US_STATE_CODES,
    generate_transactions,
    label_array,
    load_tabformer_csv,
    write_tabformer_csv,
)

N_LARGE = 200_000
N_USERS = 2000
FRAUD_RATE = 0.02

ERROR_KINDS = (
    "Bad CVV",
    "Bad Card Number",
    "Bad Expiration",
    "Bad PIN",
    "Bad Zipcode",
    "Insufficient Balance",
    "Technical Glitch",
)
# pandas' default string dtype: StringDtype(na_value=NaN) on pandas 3, object on pandas 2
STR_DTYPE = pd.Series([], dtype="str").dtype
EXPECTED_DTYPES = {
    "User": np.dtype("int64"),
    "Card": np.dtype("int64"),
    "Year": np.dtype("int64"),
    "Month": np.dtype("int64"),
    "Day": np.dtype("int64"),
    "Time": STR_DTYPE,
    "Amount": STR_DTYPE,
    "Use Chip": STR_DTYPE,
    "Merchant Name": np.dtype("int64"),
    "Merchant City": STR_DTYPE,
    "Merchant State": STR_DTYPE,
    "Zip": np.dtype("float64"),
    "MCC": np.dtype("int64"),
    "Errors?": STR_DTYPE,
    "Is Fraud?": STR_DTYPE,
}

# Lines in the real card_transaction.v1.csv format (the first two are its first two rows).
REAL_FORMAT_CSV = (
    "User,Card,Year,Month,Day,Time,Amount,Use Chip,Merchant Name,Merchant City,Merchant State,Zip,MCC,"
    "Errors?,Is Fraud?\n"
    "0,0,2002,9,1,06:21,$134.09,Swipe Transaction,3527213246127876953,La Verne,CA,91750.0,5300,,No\n"
    "0,0,2002,9,1,06:42,$38.48,Swipe Transaction,-727612092139916043,Monterey Park,CA,91754.0,5411,,No\n"
    "0,0,2002,9,2,06:22,$-64.00,Online Transaction,-1288082279022882052,ONLINE,,,4829,"
    '"Bad PIN,Technical Glitch,",Yes\n'
    '1,3,2019,12,28,23:59,$12.00,Chip Transaction,42,Zürich,Switzerland,,5812,"Insufficient Balance,",No\n'
    "2,8,2020,2,29,00:00,$5.10,Chip Transaction,7,Cambridge,MA,2151.0,5499,,No\n"
)


@pytest.fixture(scope="module")
def big() -> pd.DataFrame:
    return generate_transactions(N_LARGE, seed=7, fraud_rate=FRAUD_RATE, n_users=N_USERS)


def _foreign_mask(frame: pd.DataFrame) -> pd.Series:
    state = frame["Merchant State"]
    return state.notna() & ~state.isin(US_STATE_CODES)


def _hour(frame: pd.DataFrame) -> np.ndarray:
    return frame["Time"].str.slice(0, 2).astype(int).to_numpy()


# ---- constants ------------------------------------------------------------------------------


def test_constants() -> None:
    assert tuple(EXPECTED_DTYPES) == TABFORMER_COLUMNS
    assert len(RAW_INPUT_COLUMNS) == 14
    assert TABFORMER_COLUMNS[:-1] == RAW_INPUT_COLUMNS
    assert LABEL_COLUMN == "Is Fraud?" == TABFORMER_COLUMNS[-1]
    assert len(US_STATE_CODES) == 51
    assert {"CA", "NY", "DC", "WY"} <= US_STATE_CODES
    assert all(len(code) == 2 and code.isupper() for code in US_STATE_CODES)


# ---- generator: determinism, layout ----------------------------------------------------------


def test_same_seed_gives_identical_frame() -> None:
    first = generate_transactions(5000, seed=3)
    second = generate_transactions(5000, seed=3)
    pd.testing.assert_frame_equal(first, second)


def test_different_seeds_differ() -> None:
    first = generate_transactions(5000, seed=3)
    second = generate_transactions(5000, seed=4)
    assert not first.equals(second)
    assert not first["Merchant Name"].equals(second["Merchant Name"])


def test_dtypes_columns_and_index(big: pd.DataFrame) -> None:
    assert list(big.columns) == list(TABFORMER_COLUMNS)
    assert dict(big.dtypes) == EXPECTED_DTYPES
    assert len(big) == N_LARGE
    assert isinstance(big.index, pd.RangeIndex)
    assert big.index.equals(pd.RangeIndex(N_LARGE))


@pytest.mark.parametrize("n_rows", [1, 2, 17])
def test_tiny_frames_are_well_formed(n_rows: int) -> None:
    frame = generate_transactions(n_rows, seed=n_rows)
    assert len(frame) == n_rows
    assert dict(frame.dtypes) == EXPECTED_DTYPES
    assert set(frame[LABEL_COLUMN]) <= {"Yes", "No"}


def test_rows_sorted_by_card_then_time(big: pd.DataFrame) -> None:
    keys = big[["User", "Card", "Year", "Month", "Day", "Time"]]
    assert keys.equals(keys.sort_values(list(keys.columns)).reset_index(drop=True))


# ---- generator: value formats -----------------------------------------------------------


def test_time_format(big: pd.DataFrame) -> None:
    assert big["Time"].notna().all()
    assert big["Time"].str.fullmatch(r"\d{2}:\d{2}").all()
    hour = _hour(big)
    minute = big["Time"].str.slice(3, 5).astype(int)
    assert hour.min() == 0 and hour.max() == 23
    assert minute.between(0, 59).all()


def test_amount_format(big: pd.DataFrame) -> None:
    amount = big["Amount"]
    assert amount.notna().all()
    assert amount.str.fullmatch(r"\$-?\d+\.\d{2}").all()
    negative = amount.str.startswith("$-")
    assert 0 < negative.mean() < 0.05
    values = amount.str.slice(1).astype(float)
    assert (values[~negative] > 0).all()
    assert values.max() > 1000  # a heavy tail: the "large amount" fraud feature needs it


def test_use_chip_values(big: pd.DataFrame) -> None:
    counts = big["Use Chip"].value_counts()
    assert set(counts.index) == {"Swipe Transaction", "Chip Transaction", "Online Transaction"}
    assert (counts / len(big) > 0.05).all()
    assert big["Use Chip"].notna().all()


def test_errors_format(big: pd.DataFrame) -> None:
    errors = big["Errors?"]
    present = errors.dropna()
    assert 0.005 < len(present) / len(big) < 0.05
    kinds = "|".join(re.escape(k) for k in ERROR_KINDS)
    assert present.str.fullmatch(rf"(?:(?:{kinds}),)+").all()
    assert present.str.count(",").max() >= 2  # some cells list several errors
    assert set(present.str.split(",").explode()) - {""} == set(ERROR_KINDS)
    assert not (errors == "").any()


def test_label_values(big: pd.DataFrame) -> None:
    assert set(big[LABEL_COLUMN].unique()) == {"Yes", "No"}


def test_dates_valid(big: pd.DataFrame) -> None:
    assert big["Year"].between(2002, 2020).all()
    assert big["Year"].nunique() >= 15
    assert set(big["Month"].unique()) == set(range(1, 13))
    assert set(big["Day"].unique()) == set(range(1, 29))
    dates = pd.to_datetime(big[["Year", "Month", "Day"]].rename(columns=str.lower), errors="coerce")
    assert dates.notna().all()


def test_online_rows_have_no_location(big: pd.DataFrame) -> None:
    online = big["Use Chip"] == "Online Transaction"
    assert online.any()
    assert (online == (big["Merchant City"] == "ONLINE")).all()
    assert big.loc[online, "Merchant State"].isna().all()
    assert big.loc[online, "Zip"].isna().all()
    assert big.loc[~online, "Merchant State"].notna().all()


def test_foreign_rows_have_no_zip_and_us_rows_do(big: pd.DataFrame) -> None:
    foreign = _foreign_mask(big)
    assert 0.002 < foreign.mean() < 0.05
    assert big.loc[foreign, "Zip"].isna().all()
    us = big["Merchant State"].isin(US_STATE_CODES)
    zips = big.loc[us, "Zip"]
    assert zips.notna().all()
    assert (zips == zips.round()).all()
    assert zips.between(501, 99999).all()
    assert (zips < 10000).any()  # New England zips, whose leading zero TabFormer drops


def test_merchant_attributes_are_fixed(big: pd.DataFrame) -> None:
    per_merchant = big.groupby("Merchant Name")[["Merchant City", "Merchant State", "Zip", "MCC"]].nunique(
        dropna=False
    )
    assert (per_merchant <= 1).all().all()


# ---- generator: cardinalities ---------------------------------------------------------------


def test_cardinalities(big: pd.DataFrame) -> None:
    assert 0.95 * N_USERS <= big["User"].nunique() <= N_USERS
    assert big["User"].between(0, N_USERS - 1).all()
    assert big["Card"].between(0, 8).all()
    cards_per_user = big.groupby("User")["Card"].nunique()
    assert cards_per_user.max() >= 7 and cards_per_user.min() == 1
    assert 80 <= big["MCC"].nunique() <= 130
    assert big["MCC"].between(1000, 9999).all()
    assert {5411, 5812, 5300, 4829} <= set(big["MCC"].unique())
    assert big["Merchant Name"].nunique() >= 5000
    assert big["Merchant City"].nunique() >= 500
    assert big.loc[big["Merchant State"].isin(US_STATE_CODES), "Merchant State"].nunique() == 51
    assert big.loc[_foreign_mask(big), "Merchant State"].nunique() >= 12


def test_merchant_count_scales_to_a_million_rows() -> None:
    frame = generate_transactions(1_000_000, seed=11)
    assert frame["Merchant Name"].nunique() >= 20_000
    assert frame["Merchant City"].nunique() >= 2000


def test_non_ascii_cities_present(big: pd.DataFrame) -> None:
    cities = set(big["Merchant City"].dropna())
    assert {"Zürich", "São Paulo", "Montréal"} <= cities
    assert any(not c.isascii() for c in cities)
    state_of = big.drop_duplicates("Merchant City").set_index("Merchant City")["Merchant State"]
    assert state_of["Zürich"] == "Switzerland"
    assert state_of["São Paulo"] == "Brazil"
    assert state_of["Montréal"] == "Canada"


# ---- generator: fraud label ------------------------------------------------------------------


def test_fraud_rate_close_to_requested(big: pd.DataFrame) -> None:
    realised = (big[LABEL_COLUMN] == "Yes").mean()
    assert abs(realised - FRAUD_RATE) / FRAUD_RATE < 0.25


def test_low_fraud_rate_close_to_requested() -> None:
    rate = 0.004
    frame = generate_transactions(100_000, seed=5, fraud_rate=rate)
    realised = (frame[LABEL_COLUMN] == "Yes").mean()
    assert abs(realised - rate) / rate < 0.25


def test_fraud_signal_is_learnable(big: pd.DataFrame) -> None:
    y = label_array(big)
    online = (big["Use Chip"] == "Online Transaction").to_numpy()
    foreign = _foreign_mask(big).to_numpy()
    night = _hour(big) < 6
    risky = online | foreign | night
    assert y[risky].mean() > 3 * y[~risky].mean()
    for mask in (online, foreign, night, big["Errors?"].notna().to_numpy()):
        assert y[mask].mean() > 2 * y[~mask].mean()
    # A hand-made per-row score, no training, already ranks fraud well above chance.
    amount = big["Amount"].str.slice(1).astype(float).to_numpy()
    score = 3 * foreign + 2 * online + 2 * night + np.log(np.maximum(amount, 0.01) / 150).clip(0)
    assert roc_auc_score(y, score) > 0.7


def test_compromised_cards_have_fraud_bursts(big: pd.DataFrame) -> None:
    fraud = big.assign(y=label_array(big)).groupby(["User", "Card", "Year", "Month"])["y"].sum()
    # Without bursts, 4,000 frauds over ~100k card-months would almost never stack 5 in one.
    assert (fraud >= 5).sum() >= 10


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"n_rows": 0}, "n_rows"),
        ({"n_rows": -5}, "n_rows"),
        ({"n_rows": 2.5}, "n_rows"),
        ({"n_rows": 10, "fraud_rate": 0.0}, "fraud_rate"),
        ({"n_rows": 10, "fraud_rate": 1.0}, "fraud_rate"),
        ({"n_rows": 10, "fraud_rate": -0.1}, "fraud_rate"),
        ({"n_rows": 10, "fraud_rate": math.nan}, "fraud_rate"),
        ({"n_rows": 10, "fraud_rate": "0.1"}, "fraud_rate"),
        ({"n_rows": 10, "n_users": 0}, "n_users"),
    ],
)
def test_generate_rejects_bad_arguments(kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=name) as info:
        generate_transactions(**kwargs)
    assert isinstance(info.value, InvalidArgumentError)


# ---- CSV ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sample(big: pd.DataFrame) -> pd.DataFrame:
    """A few thousand rows that hold every awkward case: NaNs, accents, multi-error cells, refunds."""
    special = (
        big["Merchant City"].isin(["Zürich", "São Paulo", "Montréal"])
        | big["Errors?"].str.contains(",.", regex=True, na=False)
        | big["Amount"].str.startswith("$-")
        | (big["Zip"] < 10000)
    )
    picked = pd.concat([big.head(2000), big[special].head(1000)])
    return picked.reset_index(drop=True)


def test_csv_round_trip(sample: pd.DataFrame, tmp_path: Path) -> None:
    path = write_tabformer_csv(sample, tmp_path / "sub" / "card_transaction.v1.csv")
    assert path == tmp_path / "sub" / "card_transaction.v1.csv"
    loaded = load_tabformer_csv(path)
    pd.testing.assert_frame_equal(loaded, sample)
    assert dict(loaded.dtypes) == EXPECTED_DTYPES


def test_csv_written_in_real_format(sample: pd.DataFrame, tmp_path: Path) -> None:
    text = write_tabformer_csv(sample, tmp_path / "t.csv").read_text(encoding="utf-8")
    lines = text.splitlines()
    assert lines[0] == ",".join(TABFORMER_COLUMNS)
    assert len(lines) == len(sample) + 1
    assert re.search(r",\d{4,5}\.0,\d{4},", text)  # Zip as a float, e.g. "91750.0"
    assert re.search(r",ONLINE,,,\d{4},", text)  # online: empty state and zip
    assert re.search(r',"[A-Za-z ]+,[A-Za-z ]+,",(Yes|No)$', text, re.MULTILINE)
    assert "Zürich" in text
    assert not re.search(r"(^|,)(nan|NaN|None)(,|$)", text, re.MULTILINE)  # missing is an empty cell


def test_chunked_read_equals_whole(sample: pd.DataFrame, tmp_path: Path) -> None:
    path = write_tabformer_csv(sample, tmp_path / "t.csv")
    chunks = list(load_tabformer_csv(path, chunksize=700))
    assert len(chunks) == math.ceil(len(sample) / 700)
    assert all(len(c) <= 700 for c in chunks)
    assert all(dict(c.dtypes) == EXPECTED_DTYPES for c in chunks)
    pd.testing.assert_frame_equal(pd.concat(chunks), load_tabformer_csv(path))


def test_nrows(sample: pd.DataFrame, tmp_path: Path) -> None:
    path = write_tabformer_csv(sample, tmp_path / "t.csv")
    pd.testing.assert_frame_equal(load_tabformer_csv(path, nrows=100), sample.head(100))
    chunks = list(load_tabformer_csv(path, nrows=250, chunksize=100))
    assert [len(c) for c in chunks] == [100, 100, 50]


def test_load_real_format(tmp_path: Path) -> None:
    path = tmp_path / "card_transaction.v1.csv"
    path.write_text(REAL_FORMAT_CSV, encoding="utf-8")
    frame = load_tabformer_csv(path)
    assert dict(frame.dtypes) == EXPECTED_DTYPES
    names = [3527213246127876953, -727612092139916043, -1288082279022882052]
    assert frame["Merchant Name"].tolist()[:3] == names
    assert frame["Amount"].tolist()[:3] == ["$134.09", "$38.48", "$-64.00"]
    assert frame["Time"].iloc[0] == "06:21"
    assert frame["Zip"].iloc[0] == 91750.0 and frame["Zip"].iloc[4] == 2151.0
    assert math.isnan(frame["Zip"].iloc[2]) and math.isnan(frame["Zip"].iloc[3])
    assert frame["Merchant State"].isna().tolist() == [False, False, True, False, False]
    assert frame["Errors?"].iloc[2] == "Bad PIN,Technical Glitch,"
    assert frame["Errors?"].iloc[3] == "Insufficient Balance,"
    assert frame["Merchant City"].iloc[3] == "Zürich"
    assert label_array(frame).tolist() == [0, 0, 1, 0, 0]


def test_load_ignores_and_drops_extra_columns(tmp_path: Path) -> None:
    path = tmp_path / "extra.csv"
    lines = REAL_FORMAT_CSV.splitlines()
    text = "\n".join([lines[0] + ",Note"] + [line + ",x" for line in lines[1:]]) + "\n"
    path.write_text(text, encoding="utf-8")
    frame = load_tabformer_csv(path)
    assert list(frame.columns) == list(TABFORMER_COLUMNS)
    assert len(frame) == 5


def test_load_reorders_columns_to_tabformer_order(sample: pd.DataFrame, tmp_path: Path) -> None:
    path = tmp_path / "shuffled.csv"
    sample[list(reversed(TABFORMER_COLUMNS))].to_csv(path, index=False)
    loaded = load_tabformer_csv(path)
    assert list(loaded.columns) == list(TABFORMER_COLUMNS)
    pd.testing.assert_frame_equal(loaded, sample)


@pytest.mark.parametrize("chunksize", [None, 10])
def test_load_misspelled_column(tmp_path: Path, chunksize: int | None) -> None:
    path = tmp_path / "bad_header.csv"
    path.write_text(REAL_FORMAT_CSV.replace("Merchant State", "Merchant Stat", 1), encoding="utf-8")
    with pytest.raises(InvalidArgumentError) as info:
        load_tabformer_csv(path, chunksize=chunksize)
    message = str(info.value)
    assert "'Merchant State'" in message
    assert str(path) in message
    assert "Merchant Stat'" in message  # the did-you-mean hint


def test_load_missing_columns(tmp_path: Path) -> None:
    path = tmp_path / "no_label.csv"
    frame = load_tabformer_csv(_write_text(tmp_path / "ok.csv", REAL_FORMAT_CSV))
    frame.drop(columns=["Is Fraud?", "MCC"]).to_csv(path, index=False)
    with pytest.raises(InvalidArgumentError) as info:
        load_tabformer_csv(path)
    assert "'Is Fraud?'" in str(info.value)
    assert "'MCC'" in str(info.value)
    assert "no_label.csv" in str(info.value)


def test_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "card_transaction.v1.csv"
    with pytest.raises(NotFoundError, match=re.escape(str(path))):
        load_tabformer_csv(path)
    with pytest.raises(NotFoundError, match=re.escape(str(path))):
        load_tabformer_csv(str(path), chunksize=100)


def test_load_empty_file_and_bad_values(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="empty"):
        load_tabformer_csv(_write_text(tmp_path / "empty.csv", ""))
    bad = REAL_FORMAT_CSV.replace("\n0,0,2002,9,1,06:21", "\nzero,0,2002,9,1,06:21", 1)
    path = _write_text(tmp_path / "bad_user.csv", bad)
    with pytest.raises(InvalidArgumentError, match=r"bad_user\.csv"):
        load_tabformer_csv(path)
    with pytest.raises(InvalidArgumentError, match=r"bad_user\.csv"):
        list(load_tabformer_csv(path, chunksize=2))


@pytest.mark.parametrize(("kwargs", "name"), [({"nrows": 0}, "nrows"), ({"chunksize": 0}, "chunksize")])
def test_load_rejects_bad_sizes(tmp_path: Path, kwargs: dict, name: str) -> None:
    path = _write_text(tmp_path / "ok.csv", REAL_FORMAT_CSV)
    with pytest.raises(InvalidArgumentError, match=name):
        load_tabformer_csv(path, **kwargs)


def test_write_rejects_missing_columns(sample: pd.DataFrame, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="MCC"):
        write_tabformer_csv(sample.drop(columns="MCC"), tmp_path / "x.csv")
    assert not (tmp_path / "x.csv").exists()


def _write_text(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# ---- labels ---------------------------------------------------------------------------------


def test_label_array_mapping() -> None:
    frame = pd.DataFrame({LABEL_COLUMN: pd.Series(["No", "Yes", "No", "Yes", "Yes"], dtype="str")})
    labels = label_array(frame)
    assert labels.dtype == np.int8
    assert labels.tolist() == [0, 1, 0, 1, 1]


def test_label_array_matches_generated_labels(big: pd.DataFrame) -> None:
    labels = label_array(big)
    assert labels.shape == (len(big),)
    assert labels.sum() == (big[LABEL_COLUMN] == "Yes").sum()


@pytest.mark.parametrize("bad", ["yes", "1", "", None])
def test_label_array_rejects_other_values(bad: object) -> None:
    frame = pd.DataFrame({LABEL_COLUMN: ["No", "Yes", bad, "No"]})
    with pytest.raises(InvalidArgumentError) as info:
        label_array(frame)
    message = str(info.value)
    assert "'Is Fraud?'" in message
    assert repr(frame[LABEL_COLUMN].iloc[2]) in message


def test_label_array_missing_column() -> None:
    with pytest.raises(InvalidArgumentError, match=re.escape("'Is Fraud?'")):
        label_array(pd.DataFrame({"User": [1, 2]}))
