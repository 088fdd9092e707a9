"""An independent, row-by-row reference of the fraud example's preprocessing rules, Triton-style
requests and messy rows, for tests/fraud/test_features.py and tests/fraud/test_encoding_paths.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from triton_nb.fraud import ENCODED_COLUMNS, FEATURE_NAMES, RAW_INPUT_COLUMNS

US = {
    "AL AK AZ AR CA CO CT DE FL GA HI ID IL IN IA KS KY LA ME MD MA MI MN MS MO MT NE NV NH NJ NM NY NC ND OH "
    "OK OR PA RI SC SD TN TX UT VT VA WA WV WI WY DC"
}
US_STATES = set(next(iter(US)).split())


# --------------------------------------------------------------------------- a reference
# Written row by row from the rules in the issue, independently of the vectorised code.


def _missing(value) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    if isinstance(value, bytes):
        value = value.decode()
    return str(value).strip().lower() in {"", "nan", "none", "null", "<na>"}


def _text(value) -> str:
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value).strip()


def _integer_code(value) -> str:
    text = _text(value)
    try:
        number = float(text)
    except ValueError:
        return text
    if number.is_integer() and text.lstrip("-").replace(".", "", 1).isdigit():
        return str(int(text.split(".")[0]))
    return text


def reference_row(row: dict, classes: dict) -> list[float]:
    cat = {}
    for column in ENCODED_COLUMNS:
        value = row[column]
        if _missing(value):
            cat[column] = "UNKNOWN"
        elif column in ("Zip", "MCC", "Merchant Name"):
            cat[column] = _integer_code(value)
        else:
            cat[column] = _text(value)
    if cat["Merchant City"] == "ONLINE":
        cat["Merchant State"] = "ONLINE"
        cat["Zip"] = "ONLINE"
    if cat["Merchant State"] not in US_STATES | {"ONLINE"}:
        cat["Zip"] = "FOREIGN"
    codes = {}
    for column in ENCODED_COLUMNS:
        values = list(classes[column])
        codes[column] = values.index(cat[column]) if cat[column] in values else values.index("UNKNOWN")
    hour, minute = _text(row["Time"]).split(":")[:2]
    amount = float(_text(row["Amount"]).replace("$", "").replace(",", ""))
    feature = {
        "User": float(row["User"]),
        "Card": float(row["Card"]),
        "Year": float(row["Year"]),
        "Month": float(row["Month"]),
        "Day": float(row["Day"]),
        "Amount": amount,
        "Errors?": 0.0 if _missing(row["Errors?"]) else 1.0,
        "Hour": float(hour),
        "Minute": float(minute),
        **codes,
    }
    return [feature[name] for name in FEATURE_NAMES]


def reference(frame: pd.DataFrame, classes: dict) -> np.ndarray:
    rows = frame.to_dict(orient="records")
    return np.array([reference_row(row, classes) for row in rows], dtype=np.float32)


def as_triton_request(batch: pd.DataFrame, float_as_int: bool = False) -> dict[str, np.ndarray]:
    """The tensors Triton's Python backend hands over: FP32 [n, 1] and BYTES as object arrays."""
    request = {}
    for name in RAW_INPUT_COLUMNS:
        values = batch[name]
        if name in ("User", "Card", "Year", "Month", "Day"):
            request[name] = values.to_numpy(np.float32).reshape(-1, 1)
        else:
            text = ["" if pd.isna(v) else str(int(v) if float_as_int and isinstance(v, float) else v) for v in values]
            request[name] = np.array([s.encode() for s in text], dtype=object).reshape(-1, 1)
    return request


def messy_rows(sample: pd.DataFrame, n_rows: int) -> pd.DataFrame:
    """Rows with missing zips, unseen (and padded) cities, a foreign state, unseen MCCs, no chip."""
    messy = sample.head(n_rows).copy()
    messy.loc[messy.index[::4], "Zip"] = np.nan
    messy.loc[messy.index[1::9], "Merchant City"] = " Unseen City "
    messy.loc[messy.index[2::11], "Merchant State"] = "Atlantis"
    messy.loc[messy.index[3::13], "MCC"] = 1
    messy.loc[messy.index[5::7], "Use Chip"] = None
    return messy

