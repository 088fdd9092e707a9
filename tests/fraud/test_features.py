"""The example's preprocessing rules, its fixed defects, and bad input."""

from __future__ import annotations

import json
import pickle
import sys

import numpy as np
import pandas as pd
import pytest
from sklearn.preprocessing import LabelEncoder

from tests.helpers.fraud_reference import as_triton_request, messy_rows, reference
from triton_nb.errors import InvalidArgumentError, NotFoundError, UnsafeFileError
from triton_nb.fraud import (
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    RAW_INPUT_COLUMNS,
    FraudPreprocessor,
    generate_transactions,
)


def tx(**overrides) -> dict:
    """One raw transaction in the TabFormer file's formats."""
    row = {
        "User": 7,
        "Card": 1,
        "Year": 2019,
        "Month": 3,
        "Day": 14,
        "Time": "06:21",
        "Amount": "$134.09",
        "Use Chip": "Swipe Transaction",
        "Merchant Name": "-727612092139916043",
        "Merchant City": "Monterey Park",
        "Merchant State": "CA",
        "Zip": "91754.0",
        "MCC": "5411",
        "Errors?": None,
    }
    row.update(overrides)
    return row


def frame(*rows: dict) -> pd.DataFrame:
    return pd.DataFrame(list(rows), columns=list(RAW_INPUT_COLUMNS))


@pytest.fixture(scope="module")
def sample() -> pd.DataFrame:
    return generate_transactions(3000, seed=11, fraud_rate=0.05)


@pytest.fixture(scope="module")
def fitted(sample) -> FraudPreprocessor:
    return FraudPreprocessor().fit(sample)


def col(name: str) -> int:
    return FEATURE_NAMES.index(name)


def code_of(pre: FraudPreprocessor, column: str, value: str) -> int:
    return int(np.flatnonzero(pre.classes_[column] == value)[0])


# --------------------------------------------------------------------------- the rules


def test_features_match_the_independent_reference(sample, fitted):
    got = fitted.transform(sample)
    assert got.dtype == np.float32
    assert got.shape == (len(sample), 15)
    np.testing.assert_array_equal(got, reference(sample, fitted.classes_))


def test_feature_order_is_the_examples():
    assert FEATURE_NAMES == (
        "User", "Card", "Year", "Month", "Day", "Amount", "Use Chip", "Merchant Name", "Merchant City",
        "Merchant State", "Zip", "MCC", "Errors?", "Hour", "Minute",
    )
    assert list(FraudPreprocessor().get_feature_names_out()) == list(FEATURE_NAMES)


def test_classes_are_sorted_and_include_unknown(fitted):
    for column in ENCODED_COLUMNS:
        classes = fitted.classes_[column]
        assert "UNKNOWN" in classes
        assert list(classes) == sorted(classes)
        assert len(set(classes)) == len(classes)


def test_online_city_sets_state_and_zip_to_online():
    pre = FraudPreprocessor().fit(frame(tx(), tx(**{"Merchant City": "ONLINE", "Merchant State": None, "Zip": None})))
    assert "ONLINE" in pre.classes_["Merchant State"] and "ONLINE" in pre.classes_["Zip"]
    out = pre.transform(frame(tx(**{"Merchant City": "ONLINE", "Merchant State": "CA", "Zip": "91754.0"})))
    assert out[0, col("Merchant State")] == code_of(pre, "Merchant State", "ONLINE")
    assert out[0, col("Zip")] == code_of(pre, "Zip", "ONLINE")


def test_foreign_state_sets_zip_to_foreign():
    pre = FraudPreprocessor().fit(frame(tx(), tx(**{"Merchant City": "Rome", "Merchant State": "Italy", "Zip": None})))
    out = pre.transform(frame(tx(**{"Merchant City": "Milan", "Merchant State": "Italy", "Zip": "20121"})))
    assert out[0, col("Zip")] == code_of(pre, "Zip", "FOREIGN")
    # DC is a US "state": its zip is kept
    assert pre.transform(frame(tx(**{"Merchant State": "DC"})))[0, col("Zip")] == code_of(pre, "Zip", "91754")


def test_errors_amount_and_time():
    pre = FraudPreprocessor().fit(frame(tx()))
    out = pre.transform(
        frame(
            tx(**{"Errors?": "Bad PIN,Technical Glitch,", "Amount": "$-64.00", "Time": "23:59"}),
            tx(**{"Errors?": "", "Amount": "$1,250.50", "Time": "00:05"}),
        )
    )
    assert out[:, col("Errors?")].tolist() == [1.0, 0.0]
    assert out[:, col("Amount")].tolist() == [-64.0, 1250.5]
    assert out[:, col("Hour")].tolist() == [23.0, 0.0]
    assert out[:, col("Minute")].tolist() == [59.0, 5.0]


# --------------------------------------------------------------------------- fixed defects


def test_unseen_category_maps_to_unknown_instead_of_failing(fitted):
    out = fitted.transform(frame(tx(**{"MCC": "9999", "Merchant City": "Nowhere Springs", "Use Chip": "Telepathy"})))
    for column in ("MCC", "Merchant City", "Use Chip"):
        assert out[0, col(column)] == fitted.unknown_codes_[column]


def test_non_ascii_text_from_strings_and_utf8_bytes():
    zurich = tx(**{"Merchant City": "Zürich", "Merchant State": "Switzerland", "Zip": None})
    pre = FraudPreprocessor().fit(frame(tx(), zurich))
    code = code_of(pre, "Merchant City", "Zürich")
    assert pre.transform(frame(zurich))[0, col("Merchant City")] == code
    # Triton's Python backend hands BYTES tensors over as object arrays of UTF-8 bytes, [batch, 1]
    triton_style = {
        name: (np.array([[str(v).encode()]], dtype=object) if isinstance(v, str) else np.array([[v]], np.float32))
        for name, v in zurich.items()
        if v is not None
    }
    triton_style["Zip"] = np.array([[b""]], dtype=object)
    triton_style["Errors?"] = np.array([[b""]], dtype=object)
    assert pre.transform(triton_style)[0, col("Merchant City")] == code


@pytest.mark.parametrize("zip_value", ["77539", "77539.0", 77539, 77539.0, " 77539 ", "077539", b"77539.0"])
def test_zip_forms_map_to_one_code(zip_value):
    pre = FraudPreprocessor().fit(frame(tx(**{"Zip": "77539.0"}), tx()))
    assert "77539" in pre.classes_["Zip"]
    out = pre.transform({**{k: [v] for k, v in tx().items()}, "Zip": np.array([zip_value], dtype=object)})
    assert out[0, col("Zip")] == code_of(pre, "Zip", "77539")


def test_numeric_dtypes_for_integer_codes():
    pre = FraudPreprocessor().fit(frame(tx(), tx(**{"MCC": 5812, "Merchant Name": -42, "Zip": 2151.0})))
    for column, value, expected in (("MCC", np.int64(5812), "5812"), ("Merchant Name", np.int64(-42), "-42"),
                                    ("Zip", np.float64(2151.0), "2151"), ("Zip", "2151", "2151")):
        data = {k: [v] for k, v in tx().items()}
        data[column] = np.array([value])
        assert pre.transform(data)[0, col(column)] == code_of(pre, column, expected), (column, value)


@pytest.mark.parametrize("missing", ["", None, np.nan, "nan", "NaN", "  "])
def test_missing_values_same_at_training_and_serving(missing):
    training = frame(tx(**{"Merchant State": "TX", "Use Chip": None, "Errors?": np.nan}), tx())
    pre = FraudPreprocessor().fit(training)
    assert "UNKNOWN" in pre.classes_["Use Chip"]
    train_row = pre.transform(training)[0]
    serve_row = pre.transform(frame(tx(**{"Merchant State": "TX", "Use Chip": missing, "Errors?": missing})))[0]
    np.testing.assert_array_equal(train_row, serve_row)
    assert serve_row[col("Use Chip")] == pre.unknown_codes_["Use Chip"]
    assert serve_row[col("Errors?")] == 0.0


def test_fit_returns_self_and_get_params():
    pre = FraudPreprocessor()
    assert pre.fit(frame(tx())) is pre
    assert pre.get_params() == {"unknown_value": "UNKNOWN"}
    assert pre.n_features_in_ == 14


def test_pandas_and_triton_inputs_agree(sample, fitted):
    batch = sample.head(64)
    triton_style = as_triton_request(batch, float_as_int=True)
    np.testing.assert_array_equal(fitted.transform(triton_style), fitted.transform(batch))


# --------------------------------------------------------------------------- encoders on disk


def test_pickle_in_the_examples_format_and_json(tmp_path, fitted):
    pkl, js = fitted.save_encoders(tmp_path)
    assert pkl.name == "label_encoders.pkl" and js.name == "label_encoders.json"
    with open(pkl, "rb") as handle:
        raw = pickle.load(handle)
    assert isinstance(raw, dict) and set(raw) == set(ENCODED_COLUMNS)
    assert all(isinstance(v, np.ndarray) for v in raw.values())
    assert json.loads(js.read_text(encoding="utf-8"))["Zip"] == fitted.classes_["Zip"].tolist()
    sample = generate_transactions(200, seed=3)
    for source in (pkl, js, tmp_path):
        loaded = FraudPreprocessor.load_encoders(source)
        np.testing.assert_array_equal(loaded.transform(sample), fitted.transform(sample))


class _Exploit:
    def __reduce__(self):
        return (eval, ("__import__('os').system('echo pwned')",))


def test_malicious_pickle_is_refused(tmp_path):
    path = tmp_path / "label_encoders.pkl"
    path.write_bytes(pickle.dumps({"Zip": _Exploit()}))
    with pytest.raises(UnsafeFileError, match=r"refusing to load 'builtins\.eval'"):
        FraudPreprocessor.load_encoders(path)


def test_pickle_with_wrong_structure_is_refused(tmp_path):
    path = tmp_path / "label_encoders.pkl"
    path.write_bytes(pickle.dumps({"Zip": np.array([1.0, 2.0])}))
    with pytest.raises(UnsafeFileError, match="Zip"):
        FraudPreprocessor.load_encoders(path)
    path.write_bytes(b"\x80\x04garbage")
    with pytest.raises(UnsafeFileError, match=r"label_encoders\.pkl"):
        FraudPreprocessor.load_encoders(path)


def test_missing_encoder_file():
    with pytest.raises(NotFoundError, match="nowhere"):
        FraudPreprocessor.load_encoders("/nowhere/label_encoders.pkl")


def test_sklearn_label_encoders_are_interchangeable(sample, fitted):
    # Encoders fitted by scikit-learn (or cuML, whose classes_ is a cuDF Series) on the same
    # canonical values carry the same classes, hence the same codes.
    from triton_nb.fraud.features import canonical_categories

    categories = canonical_categories(sample)
    sk = {c: LabelEncoder().fit(np.append(categories[c], "UNKNOWN")) for c in ENCODED_COLUMNS}
    series_like = {c: pd.Series(sk[c].classes_) for c in ENCODED_COLUMNS}  # like cudf.Series.to_pandas()
    for encoders in (sk, series_like):
        pre = FraudPreprocessor.from_encoders(encoders)
        np.testing.assert_array_equal(pre.transform(sample), fitted.transform(sample))
    column = "Merchant City"
    np.testing.assert_array_equal(
        fitted.transform(sample)[:, col(column)],
        sk[column].transform(categories[column]).astype(np.float32),
    )


def test_encoders_must_be_sorted_and_have_unknown():
    good = {c: np.array(["A", "UNKNOWN"]) for c in ENCODED_COLUMNS}
    with pytest.raises(InvalidArgumentError, match=r"'Zip'.*sorted"):
        FraudPreprocessor.from_encoders({**good, "Zip": np.array(["UNKNOWN", "A"])})
    with pytest.raises(InvalidArgumentError, match=r"'MCC'.*UNKNOWN"):
        FraudPreprocessor.from_encoders({**good, "MCC": np.array(["A", "B"])})
    with pytest.raises(InvalidArgumentError, match="'Use Chip'"):
        FraudPreprocessor.from_encoders({c: v for c, v in good.items() if c != "Use Chip"})


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def small_fitted() -> FraudPreprocessor:
    return FraudPreprocessor().fit(frame(tx()))


def test_missing_columns_are_named(small_fitted):
    with pytest.raises(InvalidArgumentError, match=r"missing input column\(s\): 'Amount', 'MCC'"):
        small_fitted.transform(frame(tx()).drop(columns=["Amount", "MCC"]))


@pytest.mark.parametrize(
    ("column", "value", "message"),
    [
        ("Amount", "$12.x0", r"'Amount' has non-numeric value\(s\): '12.x0'"),
        ("Amount", None, "'Amount' has missing"),
        ("Amount", "inf", "'Amount' has missing or non-finite"),
        ("User", "seven", r"'User' has non-numeric value\(s\): 'seven'"),
        ("Year", np.nan, "'Year' has missing"),
        ("Time", "6pm", "'Time' has value.*'6pm'"),
        ("Time", "25:00", "'Time' has value.*'25:00'"),
        ("Time", "", "'Time' has missing"),
        ("Merchant City", {"a": 1}, "'Merchant City' holds dict values"),
        ("Use Chip", b"\xff\xfe", "'Use Chip' holds bytes that are not valid UTF-8"),
    ],
)
def test_bad_values_are_named(small_fitted, column, value, message):
    data = {k: np.array([v], dtype=object) for k, v in tx().items()}
    data[column] = np.array([value], dtype=object)
    with pytest.raises(InvalidArgumentError, match=message):
        small_fitted.transform(data)


def test_wrong_dtype_and_shape_and_empty(small_fitted):
    data = {k: [v] for k, v in tx().items()}
    with pytest.raises(InvalidArgumentError, match="'Time' has unsupported dtype"):
        small_fitted.transform({**data, "Time": np.array(["2020-01-01T06:21"], dtype="datetime64[m]")})
    with pytest.raises(InvalidArgumentError, match=r"'Zip' must be 1-D.*\[1, 2\]"):
        small_fitted.transform({**data, "Zip": np.array([["1", "2"]])})
    with pytest.raises(InvalidArgumentError, match="different numbers of rows"):
        small_fitted.transform({**data, "MCC": ["5411", "5812"]})
    with pytest.raises(InvalidArgumentError, match="empty"):
        small_fitted.transform(frame(tx()).iloc[:0])
    with pytest.raises(InvalidArgumentError, match="not fitted"):
        FraudPreprocessor().transform(frame(tx()))
    with pytest.raises(InvalidArgumentError, match="DataFrame or a mapping"):
        small_fitted.transform([tx()])


def test_no_nan_features_ever(sample, fitted):
    messy = sample.head(200).copy()
    messy.loc[messy.index[::3], "Merchant State"] = np.nan
    messy.loc[messy.index[::5], "MCC"] = 0
    messy.loc[messy.index[::7], "Zip"] = np.nan
    out = fitted.transform(messy)
    assert np.isfinite(out).all()


def test_large_triton_batches_agree_before_and_after_their_values_are_learned(sample):
    # Large batches of object bytes are looked up in the spellings seen so far; new values
    # (padded, "X.0", leading zeros, unseen, missing) must come out as the rules say, the first
    # time (judged by the rules) and every time after (looked up).
    from triton_nb.fraud.encoding.rows import _ROW_PATH_MAX_ROWS

    fitted = FraudPreprocessor().fit(sample)  # its own: nothing learned yet
    batch = messy_rows(sample, 600)
    triton_style = as_triton_request(batch)  # Zip as "91750.0"
    triton_style["MCC"][7::17, 0] = b" 0005411 "
    assert len(batch) > _ROW_PATH_MAX_ROWS
    expected = reference(batch.assign(MCC=[b" 0005411 " if i % 17 == 7 else v for i, v in enumerate(batch["MCC"])]),
                         fitted.classes_)
    lookup = fitted._encoder._lookup["MCC"]
    assert b" 0005411 " not in lookup.seen
    np.testing.assert_array_equal(fitted.transform(triton_style), expected)
    assert lookup.seen[b" 0005411 "] == code_of(fitted, "MCC", "5411")  # learned
    np.testing.assert_array_equal(fitted.transform(triton_style), expected)
    np.testing.assert_array_equal(fitted.transform(triton_style)[:200], fitted.transform(
        {k: v[:200] for k, v in triton_style.items()}))


def test_dataframe_path_for_cudf_agrees_with_numpy_path(sample, fitted):
    # The cuDF (GPU) path is written with Series operations pandas shares; on pandas it must
    # give exactly what the numpy serving path gives, messy values included.
    from triton_nb.fraud._frame_path import frame_features, frame_uniques

    messy = messy_rows(sample, 500)
    messy.loc[messy.index[6::10], "Errors?"] = "nan"
    messy["Merchant Name"] = messy["Merchant Name"].astype(str).where(messy.index % 3 != 0, "-0")
    classes = frame_uniques(messy, "UNKNOWN")
    numpy_fitted = FraudPreprocessor().fit(messy)
    for column in ENCODED_COLUMNS:
        np.testing.assert_array_equal(classes[column], numpy_fitted.classes_[column])
    table = frame_features(messy, fitted.classes_, fitted.unknown_codes_, "UNKNOWN")
    assert list(table.columns) == list(FEATURE_NAMES)
    np.testing.assert_array_equal(table.to_numpy(np.float32), fitted.transform(messy))


# --------------------------------------------------------------------------- which path runs
# FraudPreprocessor sends a frame that is neither pandas nor a mapping but has ``columns`` and
# ``to_pandas`` (how it recognises a cuDF DataFrame) to the Series-operation path in
# _frame_path, and everything else to the numpy path. These tests check that dispatch with a
# stand-in that check recognises, so they run without a GPU.


class DeviceFrame:
    """Stands in for a cuDF DataFrame: not a pandas frame, not a mapping, with ``columns``,
    ``__getitem__``, ``len`` and ``to_pandas``. Its columns are pandas Series, whose operations
    are the ones _frame_path uses on cuDF. ``host_copies`` counts calls of ``to_pandas``, which
    the frame path must never need."""

    def __init__(self, frame: pd.DataFrame) -> None:
        self._frame = frame
        self.host_copies = 0

    @property
    def columns(self) -> pd.Index:
        return self._frame.columns

    def __len__(self) -> int:
        return len(self._frame)

    def __getitem__(self, key):
        return self._frame[key]

    def to_pandas(self) -> pd.DataFrame:
        self.host_copies += 1
        return self._frame.copy()


@pytest.fixture
def paths(monkeypatch) -> dict[str, list]:
    """Records which implementation each fit and transform reached, and with what input."""
    from triton_nb.fraud import encoding, features

    calls: dict[str, list] = {"frame_uniques": [], "frame_features": [], "numpy_fit": [], "numpy_transform": []}

    def spy(name, function):
        def recorded(data, *args, **kwargs):
            calls[name].append(data)
            return function(data, *args, **kwargs)
        return recorded

    monkeypatch.setattr(features, "frame_uniques", spy("frame_uniques", features.frame_uniques))
    monkeypatch.setattr(features, "frame_features", spy("frame_features", features.frame_features))
    monkeypatch.setattr(features, "gather_columns", spy("numpy_fit", features.gather_columns))
    numpy_transform = encoding.FeatureEncoder.transform
    monkeypatch.setattr(encoding.FeatureEncoder, "transform",
                        lambda self, data: calls["numpy_transform"].append(data) or numpy_transform(self, data))
    return calls


def _device_sample(sample: pd.DataFrame) -> pd.DataFrame:
    """Messy rows, plus the values the frame path handles apart from the numpy path."""
    messy = messy_rows(sample, 500)
    messy.loc[messy.index[6::10], "Errors?"] = "nan"
    messy["Merchant Name"] = messy["Merchant Name"].astype(str).where(messy.index % 3 != 0, "-0")
    return messy


def test_a_device_frame_is_fit_and_transformed_on_the_frame_path(sample, paths):
    messy = _device_sample(sample)
    device = DeviceFrame(messy)
    on_device = FraudPreprocessor().fit(device)
    assert [id(x) for x in paths["frame_uniques"]] == [id(device)] and paths["numpy_fit"] == []
    table = on_device.transform(device)
    assert [id(x) for x in paths["frame_features"]] == [id(device)] and paths["numpy_transform"] == []
    assert device.host_copies == 0  # the rows were never copied to the host to be encoded
    # the answer is a float32 frame of the device library, equal to the numpy path's matrix
    assert isinstance(table, pd.DataFrame) and list(table.columns) == list(FEATURE_NAMES)
    assert set(table.dtypes) == {np.dtype(np.float32)}
    on_host = FraudPreprocessor().fit(messy)
    for column in ENCODED_COLUMNS:
        np.testing.assert_array_equal(on_device.classes_[column], on_host.classes_[column])
    np.testing.assert_array_equal(table.to_numpy(), on_host.transform(messy))
    # and the classes learned on either path encode the other path's input alike
    np.testing.assert_array_equal(on_host.transform(device).to_numpy(), on_device.transform(messy))


def test_pandas_frames_and_numpy_mappings_take_the_numpy_path(sample, paths):
    messy = _device_sample(sample)
    columns = {name: messy[name].to_numpy() for name in RAW_INPUT_COLUMNS}
    triton_style = as_triton_request(messy)
    expected = FraudPreprocessor().fit(messy).transform(messy)
    for data in (messy, columns, triton_style):
        paths["numpy_fit"].clear()
        paths["numpy_transform"].clear()
        fitted_here = FraudPreprocessor().fit(data)
        got = fitted_here.transform(data)
        assert [id(x) for x in paths["numpy_fit"]] == [id(data)]
        assert [id(x) for x in paths["numpy_transform"]] == [id(data)]
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_array_equal(got, expected)
    assert paths["frame_uniques"] == [] and paths["frame_features"] == []


def test_a_device_frame_is_refused_with_the_numpy_paths_messages(small_fitted):
    good = frame(tx())
    for spoil in (lambda f: f.drop(columns=["Amount", "MCC"]), lambda f: f.iloc[:0]):
        with pytest.raises(InvalidArgumentError) as on_host:
            small_fitted.transform(spoil(good))
        with pytest.raises(InvalidArgumentError) as on_device:
            small_fitted.transform(DeviceFrame(spoil(good)))
        assert str(on_device.value) == str(on_host.value)
    with pytest.raises(InvalidArgumentError, match=r"missing input column\(s\): 'MCC'"):
        FraudPreprocessor().fit(DeviceFrame(good.drop(columns=["MCC"])))


def test_training_places_a_device_frame_by_device(sample, monkeypatch):
    """train_fraud_model keeps a cuDF frame on the GPU (and moves a pandas one there) only when
    it trains on CUDA and cuDF can use the device; otherwise it trains from a pandas copy."""
    import types

    from triton_nb.fraud import train

    rows = sample.head(50)
    for device, gpu in (("cpu", True), ("cpu", False), ("cuda", False)):
        monkeypatch.setattr(train, "cudf_gpu_available", lambda gpu=gpu: gpu)
        stand_in = DeviceFrame(rows)
        placed, on_gpu = train._place_frame(stand_in, device)
        assert not on_gpu and isinstance(placed, pd.DataFrame) and stand_in.host_copies == 1
        placed, on_gpu = train._place_frame(rows, device)
        assert placed is rows and not on_gpu
    monkeypatch.setattr(train, "cudf_gpu_available", lambda: True)
    monkeypatch.setitem(sys.modules, "cudf", types.SimpleNamespace(from_pandas=DeviceFrame))
    stand_in = DeviceFrame(rows)
    assert train._place_frame(stand_in, "cuda:0") == (stand_in, True)
    placed, on_gpu = train._place_frame(rows, "cuda")
    assert on_gpu and isinstance(placed, DeviceFrame) and placed.to_pandas().equals(rows)


def test_training_from_a_device_frame_equals_training_from_pandas(sample, monkeypatch, paths):
    # The GPU branch of training (frame path features, rows taken with .iloc) run on the CPU:
    # placement as on a CUDA machine with cuDF, XGBoost itself on the CPU.
    from triton_nb.fraud import train

    place = train._place_frame
    monkeypatch.setattr(train, "cudf_gpu_available", lambda: True)
    monkeypatch.setattr(train, "_place_frame", lambda frame, device: place(frame, "cuda"))
    options = {"num_boost_round": 8, "early_stopping_rounds": None, "device": "cpu", "progress": False, "nthread": 2}
    device = DeviceFrame(sample)
    from_device = train.train_fraud_model(device, **options)
    assert paths["frame_uniques"] and paths["frame_features"] and paths["numpy_fit"] == []
    assert device.host_copies == 0
    monkeypatch.setattr(train, "_place_frame", place)
    from_host = train.train_fraud_model(sample, **options)
    for column, classes in from_host.preprocessor.classes_.items():
        np.testing.assert_array_equal(from_device.preprocessor.classes_[column], classes)
    np.testing.assert_array_equal(from_device.evaluation["value"], from_host.evaluation["value"])
    np.testing.assert_allclose(from_device.predict_proba(sample), from_host.predict_proba(sample), rtol=1e-6)


@pytest.mark.gpu
def test_real_cudf_frames_agree_with_the_numpy_path(sample):
    cudf = pytest.importorskip(
        "cudf", reason="cuDF is not installed (it needs an NVIDIA GPU); the cuDF path itself runs only where it is")
    messy = _device_sample(sample)
    on_gpu = cudf.from_pandas(messy)
    on_device = FraudPreprocessor().fit(on_gpu)
    on_host = FraudPreprocessor().fit(messy)
    for column in ENCODED_COLUMNS:
        np.testing.assert_array_equal(on_device.classes_[column], on_host.classes_[column])
    table = on_device.transform(on_gpu)
    assert isinstance(table, cudf.DataFrame) and list(table.columns) == list(FEATURE_NAMES)
    np.testing.assert_array_equal(table.to_pandas().to_numpy(np.float32), on_host.transform(messy))
