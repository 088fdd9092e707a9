"""The preprocessing's two paths — row by row for small batches, whole columns for the rest —
give the same features, and the row path leaves every unusual value to the column path."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.helpers.fraud_reference import as_triton_request, messy_rows, reference
from triton_nb.fraud import FraudPreprocessor, generate_transactions
from triton_nb.fraud.encoding import (
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    RAW_INPUT_COLUMNS,
    FeatureEncoder,
    FeatureInputError,
    gather_columns,
)
from triton_nb.fraud.encoding import columns as column_access
from triton_nb.fraud.encoding import encoder as estimator
from triton_nb.fraud.encoding import numeric as numeric_rules
from triton_nb.fraud.encoding import rows as row_path
from triton_nb.fraud.encoding import spellings as spelling_tables
from triton_nb.fraud.encoding import text as text_rules


@pytest.fixture(scope="module")
def sample() -> pd.DataFrame:
    return generate_transactions(3000, seed=11, fraud_rate=0.05)


@pytest.fixture(scope="module")
def encoder(sample) -> FeatureEncoder:
    return FeatureEncoder(FraudPreprocessor().fit(sample).classes_)


def both_paths(encoder: FeatureEncoder, data, request_taken: list[bool] | None = None,
               ) -> tuple[np.ndarray | None, np.ndarray | BaseException]:
    """Each path's answer, each from the spellings known at load: neither reads what the other
    learned, so each applies its own rules to every new value. ``request_taken`` records whether
    a Triton request's own way in took it."""
    arrays = gather_columns(data, RAW_INPUT_COLUMNS)
    encoder._forget()
    rows = encoder._rows.transform(arrays)
    if type(data) is dict:  # a Triton request has its own way in, which takes bytes only: what it
        encoder._forget()  # takes, the gathered columns take too, with the same answer
        request = encoder._rows.transform_request(data)
        if request_taken is not None:
            request_taken.append(request is not None)
        if request is not None:
            assert rows is not None
            np.testing.assert_array_equal(request, rows)
    encoder._forget()
    try:
        columns: np.ndarray | BaseException = encoder._transform_columns(arrays)
    except FeatureInputError as exc:
        columns = exc
    encoder._forget()
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
    taken: list[tuple[str, int]] = []
    features, one = encoder._rows._features, encoder._rows._one

    def spy_features(columns):
        taken.append(("lists", len(columns[0])))
        return features(columns)

    def spy_one(row):
        taken.append(("one row", 1))
        return one(row)

    monkeypatch.setattr(encoder._rows, "_features", spy_features)
    monkeypatch.setattr(encoder._rows, "_one", spy_one)
    limit = row_path._ROW_PATH_MAX_ROWS
    for rows in (1, limit, limit + 1, 300):
        encoder.transform(as_triton_request(sample.head(rows)))
        encoder.transform(sample.head(rows))  # a DataFrame: gathered, then as lists
    assert taken == [("one row", 1), ("lists", 1), ("lists", limit), ("lists", limit)]


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
    request_taken: list[bool] = []
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
        by_rows, by_columns = both_paths(encoder, request, request_taken)
        if by_rows is None:
            fell_back += 1  # the column path decides (its features or its error): what transform returns
            continue
        taken += 1
        assert not isinstance(by_columns, BaseException), by_columns  # the row path took what the column path refused
        np.testing.assert_array_equal(by_rows, by_columns)
    assert taken > 1000 and fell_back > 200, (taken, fell_back)  # both sides of the question were asked
    assert 1000 < sum(request_taken) < taken, sum(request_taken)  # and of the request's own way in


SPELLINGS = [b"5411", b"-5411", b"0", b"-0", b"00", b"007", b"5411.0", b"5411.00", b"0.0", b"-0.0", b"-", b".0",
             b"5.0.0",
             b"54a1", b"54 11", b" 5411", b"5411 ", b"\t5411", b"5411\n", b"-5411.0", b"--5", b"5-4", b"1e3", b"+5",
             b"Monterey Park", b" Monterey Park", b"Z\xc3\xbcrich", b"\xff", b"a\x00b", b"ONLINE", b"nAn", b"x",
             b"12345678901234567890123", b"UNKNOWN"]


@pytest.mark.parametrize("integer", [True, False], ids=["integer column", "text column"])
def test_a_value_judged_canonical_is_left_as_it_is_by_the_rules(integer):
    column = "Zip" if integer else "Merchant City"
    raw = np.array(SPELLINGS, dtype="S")
    judged = text_rules._already_canonical(raw, integer=integer)
    for value, plain in zip(SPELLINGS, judged.tolist(), strict=True):
        try:
            canonical = text_rules._canonical_bytes(np.array([value], dtype="S"), column, b"UNKNOWN")[0]
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


# --------------------------------------------------------------------------- spellings learned
# Both paths look category values up in the spellings seen so far and judge only new ones by the
# rules. What is learned must change no answer: not on the next request, not on the other path.


def as_fixed_width(request: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The request with its text as S arrays, which only the rules themselves read."""
    return {name: values.astype("S") if values.dtype == object else values for name, values in request.items()}


def rules_alone(encoder: FeatureEncoder, request: dict[str, np.ndarray]) -> np.ndarray:
    encoder._forget()
    return encoder._transform_columns(gather_columns(as_fixed_width(request), RAW_INPUT_COLUMNS))


def spoiled(request: dict[str, np.ndarray], seed: int) -> dict[str, np.ndarray]:
    """Some text values replaced by tricky byte spellings (those the rules accept)."""
    rng = np.random.default_rng(seed)
    request = {name: values.copy() for name, values in request.items()}
    tricky = [v for v in TEXT if isinstance(v, bytes) and b"\xff" not in v and b"\x00" not in v]
    for name in (*ENCODED_COLUMNS, "Errors?"):
        rows = rng.choice(len(request[name]), size=max(1, len(request[name]) // 5), replace=False)
        request[name][rows, 0] = [tricky[i] for i in rng.integers(len(tricky), size=len(rows))]
    return request


@pytest.mark.parametrize("rows", [1, 7, 64, 161, 700])
def test_learned_spellings_answer_as_the_rules(sample, rows):
    encoder = FeatureEncoder(FraudPreprocessor().fit(sample).classes_)
    unseen = as_triton_request(generate_transactions(rows, seed=rows))
    for request in (unseen, spoiled(unseen, rows), as_triton_request(messy_rows(sample, rows))):
        expected = rules_alone(encoder, request)
        encoder._forget()
        cold = encoder.transform(request)
        learned = sum(len(lookup.seen) - len(lookup.base) for lookup in encoder._lookup.values())
        warm = encoder.transform(request)
        np.testing.assert_array_equal(cold, expected)
        np.testing.assert_array_equal(warm, expected)
        # the first call judged new values (unseen merchants at least), the second looked them up
        assert learned > 0 or request is not unseen
        assert (len(encoder._locations.seen) > 0) == (rows > row_path._ROW_PATH_MAX_ROWS)  # whole columns only
    # values learned on one path, looked up on the other
    small, large = spoiled(unseen, 1), as_triton_request(generate_transactions(400, seed=rows))
    large = {name: np.concatenate([small[name]] * 3 + [large[name]]) for name in large}
    for first, second in ((small, large), (large, small)):
        expected = rules_alone(encoder, second)
        encoder._forget()
        encoder.transform(first)
        np.testing.assert_array_equal(encoder.transform(second), expected)


def test_unseen_states_and_an_unseen_online_keep_the_location_rules(sample):
    # Fitted without ONLINE rows and without Wyoming: an unseen "WY" has the unknown state code
    # yet is a US state, so its zip stays; "ONLINE" has the unknown city code yet is online.
    training = sample[(sample["Merchant City"] != "ONLINE") & (sample["Merchant State"] != "WY")]
    classes = FraudPreprocessor().fit(training).classes_
    assert "ONLINE" not in classes["Merchant City"] and "WY" not in classes["Merchant State"]
    rows = sample[sample["Merchant State"].isin(["CA", "TX"])].head(40).reset_index(drop=True)
    rows.loc[::3, "Merchant State"] = "WY"
    rows.loc[1::3, "Merchant City"] = "ONLINE"
    rows.loc[2::6, "Merchant State"] = "Atlantis"
    expected = reference(rows, classes)
    encoder = FeatureEncoder(classes)
    zip_column = FEATURE_NAMES.index("Zip")
    assert (expected[::3, zip_column] != encoder._rule_codes["Zip", b"FOREIGN"]).all()
    for batch in (rows.head(1), rows, pd.concat([rows] * 6, ignore_index=True)):
        request = as_triton_request(batch)
        encoder._forget()  # each path judges the values itself
        for _ in range(2):  # judged, then looked up
            np.testing.assert_array_equal(encoder.transform(request), reference(batch, classes))


def test_what_is_learned_is_bounded(sample, monkeypatch):
    monkeypatch.setattr(spelling_tables, "_LEARNED_LIMIT", 10)
    encoder = FeatureEncoder(FraudPreprocessor().fit(sample).classes_)
    lookup = encoder._lookup["Merchant Name"]
    base = generate_transactions(200, seed=3)
    for start in range(0, 60, 6):
        for rows in (3, 200):
            batch = base.head(rows).copy()
            batch["Merchant Name"] = [str(10**12 + start + i % 6) for i in range(rows)]  # 6 new names
            got = encoder.transform(as_triton_request(batch))
            np.testing.assert_array_equal(got, reference(batch, encoder.classes))
            assert len(lookup.seen) - len(lookup.base) <= 10


def test_a_value_the_rules_refuse_is_refused_on_a_large_batch_and_not_learned(sample, encoder):
    request = as_triton_request(generate_transactions(300, seed=4))
    request["Merchant City"][[5, 250], 0] = b"Z\xff rich"
    with pytest.raises(FeatureInputError) as by_lookup:
        encoder.transform(request)
    with pytest.raises(FeatureInputError) as by_rules:
        rules_alone(encoder, request)
    assert str(by_lookup.value) == str(by_rules.value) and "Merchant City" in str(by_lookup.value)
    assert b"Z\xff rich" not in encoder._lookup["Merchant City"].seen
    request["Merchant City"][0, 0] = bytearray(b"Paris")  # not text, to the rules
    with pytest.raises(FeatureInputError, match="Merchant City"):
        encoder.transform(request)
    # refused in two columns: the error is the first column's in ENCODED_COLUMNS order, as the
    # rules alone give it, though the location columns are read together first
    request["Merchant City"][0, 0] = b"Paris"
    request["MCC"][9, 0] = b"\xfe"
    with pytest.raises(FeatureInputError) as by_lookup:
        encoder.transform(request)
    with pytest.raises(FeatureInputError) as by_rules:
        rules_alone(encoder, request)
    assert str(by_lookup.value) == str(by_rules.value) and "'MCC'" in str(by_lookup.value)


def test_locations_are_read_column_by_column_where_codes_do_not_pack(sample, monkeypatch):
    monkeypatch.setattr(estimator, "_CODE_BITS", 3)  # 8 codes a column at most: these classes are wider
    encoder = FeatureEncoder(FraudPreprocessor().fit(sample).classes_)
    assert not encoder._locations.usable
    batch = generate_transactions(400, seed=8)
    for _ in range(2):
        np.testing.assert_array_equal(encoder.transform(as_triton_request(batch)), reference(batch, encoder.classes))
    assert encoder._locations.seen == {}


def test_requests_not_shaped_as_triton_hands_them_over_are_gathered(sample, encoder):
    request = as_triton_request(sample.head(3))
    flat = {name: values.ravel() for name, values in request.items()}  # 1-D: gathered, same answer
    cube = {**request, "MCC": request["MCC"].reshape(3, 1, 1)}
    ints = {**request, "Day": request["Day"].astype(np.int64)}
    lists = {**request, "Zip": request["Zip"].tolist()}
    wide = {**request, "User": np.repeat(request["User"], 2, axis=1), "Card": request["Card"][:, :0]}
    for data in (flat, cube, ints, lists, wide):
        assert encoder._rows.transform_request(data) is None
    expected = encoder.transform(sample.head(3))
    for data in (flat, ints, lists):
        np.testing.assert_array_equal(encoder.transform(data), expected)
    for data in (cube, wide):
        with pytest.raises(FeatureInputError, match="must be 1-D"):
            encoder.transform(data)


AMOUNTS = [b"$0.00", b"$-0.00", b"$12.34", b"$-64.00", b"$1234567890123.99", b"$-9999999999999.99",
           b"$12345678901234.99", b"$1.5", b"$1.500", b"12.34", b"$$1.00", b"$ 1.00", b"$1,200.00", b"$-",
           b"$.50", b"$1.-5", b"$-1-.00", b"$1\n.00", b"$9.99x", b"$\xd9\xa3.00", b"$1e3.00", b"$-.00", b"$",
           b"", b"$0.1\n", b"$00.07"]


@pytest.mark.parametrize("spelling", AMOUNTS)
def test_amounts_read_from_one_buffer_are_what_parsing_gives(spelling):
    values = np.array([b"$26.10", spelling, b"$-3.05", spelling], dtype=object)
    fast = numeric_rules._tabformer_amounts(values)
    try:
        expected: np.ndarray | str = numeric_rules._numeric(values.astype("S"), "Amount", currency=True)
    except FeatureInputError as exc:
        expected = str(exc)
    if fast is not None:  # taken: bit for bit what parsing the text gives, the sign of zero too
        assert isinstance(expected, np.ndarray)
        np.testing.assert_array_equal(fast.view(np.int64), expected.view(np.int64))
    try:
        got: np.ndarray | str = numeric_rules._numeric(values, "Amount", currency=True)
    except FeatureInputError as exc:
        got = str(exc)
    assert type(got) is type(expected)
    if isinstance(got, str):
        assert got == expected
    else:
        np.testing.assert_array_equal(got.view(np.int64), expected.view(np.int64))
    taken = {b"$0.00", b"$-0.00", b"$12.34", b"$-64.00", b"$1234567890123.99", b"$-9999999999999.99", b"$00.07"}
    assert (fast is not None) == (spelling in taken)


TIMES = [b"06:21", b"23:59", b"6:21", b"06:21x", b"24:00", b"12:60", b"06:2\n", b"1230:", b"ab:cd", b"06:21:59",
         b" 6:21", b"", b"0621\n"]


@pytest.mark.parametrize("first", TIMES)
@pytest.mark.parametrize("second", TIMES)
def test_times_read_from_one_buffer_are_what_the_rules_give(first, second):
    values = np.array([b"00:00", first, second], dtype=object)
    answers = []
    for array in (values, values.astype("S")):
        try:
            answers.append(tuple(part.tolist() for part in numeric_rules._hour_minute(array)))
        except FeatureInputError as exc:
            answers.append(str(exc))
    assert answers[0] == answers[1]


def test_error_flags_looked_up_are_what_the_rules_give():
    spellings = [b"", b" ", b"nan", b" NaN ", b"None", b"null", b"<NA>", b"Bad PIN,", b"Insufficient Balance,",
                 b"\x00", b"a\x00", b"\xff", b"0"]
    flags = spelling_tables._ErrorFlags()
    for first in spellings:
        values = np.array([first, *spellings, first], dtype=object)
        expected = (~text_rules._is_missing(text_rules._as_bytes(values, "Errors?"))).astype(float)
        for _ in range(2):  # judged, then looked up
            got = flags.of_objects(values)
            if b"\x00" in b"".join(values.tolist()):
                assert got is None  # NULs are the column path's to judge
            else:
                np.testing.assert_array_equal(got, expected)
    for odd in (np.array([b"x", "x"], dtype=object), np.array([b"x", None], dtype=object)):
        assert flags.of_objects(odd) is None


def test_the_numeric_columns_come_first():
    # the row path reads and writes them as one block
    assert RAW_INPUT_COLUMNS[:5] == column_access._NUMERIC_COLUMNS == FEATURE_NAMES[:5]


def test_numpy_char_as_triton_images_have_it_gives_the_same_answers(sample, encoder, monkeypatch):
    # Triton's Python backend needs numpy 1.x, which has no numpy.strings: there the rules run
    # on numpy.char, whose functions differ in form (partition stacks its three parts). The
    # same rules on numpy.char must give the same features and the same errors.
    batch = messy_rows(sample, 400)
    requests = [batch, as_triton_request(batch), as_triton_request(sample.head(300)), batch.head(7)]
    bad = as_triton_request(sample.head(300))
    bad["Time"][3, 0] = b"25:61"
    with pytest.raises(FeatureInputError) as expected_error:
        encoder.transform(bad)
    expected = [encoder.transform(request) for request in requests]
    for module in (text_rules, numeric_rules, spelling_tables):
        monkeypatch.setattr(module, "_str", np.char)
    legacy = FeatureEncoder(encoder.classes)
    for request, features in zip(requests, expected, strict=True):
        np.testing.assert_array_equal(legacy._transform_columns(gather_columns(request, RAW_INPUT_COLUMNS)), features)
    with pytest.raises(FeatureInputError) as error:
        legacy.transform(bad)
    assert str(error.value) == str(expected_error.value)
