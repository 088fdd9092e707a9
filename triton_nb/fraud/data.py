"""TabFormer card transactions: a seeded synthetic generator and a hardened CSV reader/writer.

NVIDIA's Triton fraud example trains on IBM's TabFormer synthetic credit-card transactions
(``card_transaction.v1.csv``, 24M rows, also published as
``credit_card_transactions-ibm_v2.csv``). That file is large and not always at hand, so
:func:`generate_transactions` makes a stand-in with the same columns, the same value formats and
realistic cardinalities, plus a fraud label that a per-row model can actually learn.

Both sources give exactly the same frame layout, so downstream code never has to care where the
data came from:

* ``User, Card, Year, Month, Day, Merchant Name, MCC`` -- ``int64``;
* ``Zip`` -- ``float64`` (the file writes ``"91750.0"``; an empty cell is ``NaN``);
* ``Time, Amount, Use Chip, Merchant City, Merchant State, Errors?, Is Fraud?`` -- pandas' default
  string dtype (``"str"``, i.e. ``pd.StringDtype(na_value=np.nan)`` in pandas 3), ``NaN`` when empty;
  ``Amount`` keeps the file's ``"$134.09"`` / ``"$-64.00"`` form.

Columns are always in :data:`TABFORMER_COLUMNS` order.
"""

from __future__ import annotations

import difflib
import functools
import math
import numbers
import operator
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, overload

import numpy as np
import pandas as pd

from triton_nb.errors import InvalidArgumentError, NotFoundError
from triton_nb.fraud.encoding import RAW_INPUT_COLUMNS, US_STATE_CODES

__all__ = [
    "LABEL_COLUMN",
    "RAW_INPUT_COLUMNS",
    "TABFORMER_COLUMNS",
    "US_STATE_CODES",
    "generate_transactions",
    "label_array",
    "load_tabformer_csv",
    "write_tabformer_csv",
]

#: The label column; ``"Yes"`` marks a fraudulent transaction, ``"No"`` a genuine one.
LABEL_COLUMN = "Is Fraud?"

#: The columns of the TabFormer CSV file, in file order: the model's raw inputs, then the label.
TABFORMER_COLUMNS: tuple[str, ...] = (*RAW_INPUT_COLUMNS, LABEL_COLUMN)

# "str" rather than pd.StringDtype(na_value=np.nan) so the module still imports (and generator
# and loader still agree, on object dtype) under pandas 2, where the spelled-out dtype is missing.
_STR = "str"
_INT_COLUMNS = ("User", "Card", "Year", "Month", "Day", "Merchant Name", "MCC")
_FLOAT_COLUMNS = ("Zip",)
_STR_COLUMNS = tuple(c for c in TABFORMER_COLUMNS if c not in _INT_COLUMNS + _FLOAT_COLUMNS)
_CSV_DTYPES: dict[str, Any] = {
    **dict.fromkeys(_INT_COLUMNS, "int64"),
    **dict.fromkeys(_FLOAT_COLUMNS, "float64"),
    **dict.fromkeys(_STR_COLUMNS, _STR),
}

_ONLINE_CITY = "ONLINE"
_USE_CHIP_KINDS = ("Swipe Transaction", "Chip Transaction", "Online Transaction")
_SWIPE, _CHIP, _ONLINE = range(3)

# Approximate 2020 populations (millions) and the first digit of the state's ZIP codes. The
# population weights both where users live and where merchants are, so that local shopping
# finds merchants; the ZIP digit puts New England in 0xxxx, whose leading zero TabFormer loses.
_STATES: tuple[tuple[str, float, int], ...] = (
    ("AL", 5.0, 3), ("AK", 0.73, 9), ("AZ", 7.2, 8), ("AR", 3.0, 7), ("CA", 39.5, 9),
    ("CO", 5.8, 8), ("CT", 3.6, 0), ("DE", 1.0, 1), ("DC", 0.69, 2), ("FL", 21.5, 3),
    ("GA", 10.7, 3), ("HI", 1.46, 9), ("ID", 1.84, 8), ("IL", 12.8, 6), ("IN", 6.8, 4),
    ("IA", 3.2, 5), ("KS", 2.9, 6), ("KY", 4.5, 4), ("LA", 4.66, 7), ("ME", 1.36, 0),
    ("MD", 6.2, 2), ("MA", 7.0, 0), ("MI", 10.1, 4), ("MN", 5.7, 5), ("MS", 2.96, 3),
    ("MO", 6.15, 6), ("MT", 1.08, 5), ("NE", 1.96, 6), ("NV", 3.1, 8), ("NH", 1.38, 0),
    ("NJ", 9.3, 0), ("NM", 2.1, 8), ("NY", 20.2, 1), ("NC", 10.4, 2), ("ND", 0.78, 5),
    ("OH", 11.8, 4), ("OK", 3.96, 7), ("OR", 4.24, 9), ("PA", 13.0, 1), ("RI", 1.1, 0),
    ("SC", 5.1, 2), ("SD", 0.89, 5), ("TN", 6.9, 3), ("TX", 29.1, 7), ("UT", 3.27, 8),
    ("VT", 0.64, 0), ("VA", 8.6, 2), ("WA", 7.7, 9), ("WV", 1.79, 2), ("WI", 5.9, 5),
    ("WY", 0.58, 8),
)  # fmt: skip

# Foreign merchants: TabFormer puts the country name in Merchant State and leaves Zip empty.
# Real city names keep their accents, which is what trips up naive (ASCII/bytes) encoders.
_FOREIGN_CITIES: tuple[tuple[str, str], ...] = (
    ("Rome", "Italy"), ("Milan", "Italy"), ("Florence", "Italy"),
    ("Mexico City", "Mexico"), ("Cancún", "Mexico"), ("Guadalajara", "Mexico"),
    ("Tokyo", "Japan"), ("Osaka", "Japan"),
    ("Zürich", "Switzerland"), ("Geneva", "Switzerland"),
    ("São Paulo", "Brazil"), ("Rio de Janeiro", "Brazil"),
    ("Montréal", "Canada"), ("Toronto", "Canada"), ("Québec", "Canada"), ("Vancouver", "Canada"),
    ("München", "Germany"), ("Berlin", "Germany"), ("Köln", "Germany"),
    ("Paris", "France"), ("Nice", "France"),
    ("London", "United Kingdom"), ("Edinburgh", "United Kingdom"),
    ("Madrid", "Spain"), ("Málaga", "Spain"), ("Barcelona", "Spain"),
    ("Amsterdam", "Netherlands"), ("Dublin", "Ireland"),
    ("Beijing", "China"), ("Shanghai", "China"), ("Mumbai", "India"), ("Manila", "Philippines"),
    ("Santo Domingo", "Dominican Republic"), ("Punta Cana", "Dominican Republic"),
    ("Kingston", "Jamaica"), ("Montego Bay", "Jamaica"), ("San José", "Costa Rica"),
    ("Tromsø", "Norway"), ("Oslo", "Norway"), ("Malmö", "Sweden"), ("Stockholm", "Sweden"),
    ("Kraków", "Poland"), ("Seoul", "South Korea"), ("Lima", "Peru"), ("Athens", "Greece"),
    ("Istanbul", "Turkey"), ("Prague", "Czech Republic"),
)  # fmt: skip

# (MCC, share of merchants, median ticket in dollars). A few everyday codes dominate, as in the
# real data; the long tail (airlines 3xxx, hotels, services) is what makes ~100 distinct codes.
_MCC_HEAD: tuple[tuple[int, float, float], ...] = (
    (5411, 0.12, 45), (5812, 0.08, 35), (5300, 0.07, 90), (4829, 0.06, 110), (5499, 0.06, 20),
    (5541, 0.06, 40), (5912, 0.04, 25), (4121, 0.04, 18), (5814, 0.04, 12), (7538, 0.02, 180),
    (5311, 0.02, 70), (4784, 0.02, 10), (5651, 0.015, 60), (4900, 0.015, 130), (5942, 0.01, 25),
    (7832, 0.01, 30), (5211, 0.01, 90), (5310, 0.01, 45), (5732, 0.01, 200), (5094, 0.003, 350),
    (7995, 0.003, 100), (4722, 0.003, 500),
)  # fmt: skip
_MCC_TAIL: tuple[tuple[int, float], ...] = (
    *((code, 300.0) for code in (
        3001, 3005, 3006, 3007, 3008, 3009, 3058, 3066, 3075, 3132, 3144, 3174, 3256, 3260, 3359,
        3387, 3389, 3390, 3393, 3395, 3405, 3504, 3509, 3596, 3640, 3684, 3722, 3730, 3771, 3775,
        3780,
    )),
    (1711, 250), (2741, 60), (4111, 8), (4112, 90), (4131, 30), (4214, 150), (4411, 400),
    (4511, 350), (4814, 70), (4899, 80), (5045, 300), (5192, 20), (5193, 45), (5251, 40),
    (5261, 50), (5621, 70), (5655, 60), (5661, 80), (5712, 400), (5719, 60), (5722, 350),
    (5733, 150), (5932, 120), (5947, 25), (5970, 30), (5977, 30), (6300, 150), (7011, 250),
    (7210, 20), (7230, 35), (7276, 200), (7349, 120), (7393, 200), (7531, 400), (7542, 15),
    (7549, 90), (7801, 50), (7802, 60), (7922, 80), (7996, 60), (8011, 150), (8021, 180),
    (8041, 70), (8043, 120), (8049, 90), (8062, 400), (8099, 100), (8111, 300), (8931, 200),
    (9402, 15), (5813, 30), (5921, 30), (5331, 20), (5200, 90), (5815, 10), (5816, 15),
    (5993, 25), (7372, 50), (8220, 400), (8398, 50),
)  # fmt: skip
_MCC_TAIL_SHARE = 0.0025
# Jewelry, electronics, gambling and travel agencies: goods that are easy to resell or cash out.
_RISKY_MCCS = (5094, 5732, 7995, 4722)

# TabFormer's error kinds, in the (alphabetical) order it lists several in one cell, with their
# relative frequency among erroneous transactions.
_ERROR_KINDS: tuple[tuple[str, float], ...] = (
    ("Bad CVV", 0.05), ("Bad Card Number", 0.05), ("Bad Expiration", 0.05), ("Bad PIN", 0.2),
    ("Bad Zipcode", 0.05), ("Insufficient Balance", 0.4), ("Technical Glitch", 0.2),
)  # fmt: skip
# Errors that mean someone tried card details they do not really hold.
_CARD_DETAIL_ERRORS = frozenset({"Bad CVV", "Bad Card Number", "Bad Expiration", "Bad PIN", "Bad Zipcode"})

_CITY_LEADS = ("", "North ", "South ", "East ", "West ", "New ", "Fort ", "Mount ")
_CITY_ROOTS = (
    "Oak", "Maple", "Cedar", "Pine", "Elm", "Ash", "Birch", "Willow", "Spring", "River", "Stone",
    "Clay", "Green", "Fair", "Glen", "Brook", "Mill", "Rock", "Sand", "Silver", "Gold", "Iron",
    "Copper", "Red", "White", "Black", "Blue", "Bright", "Clear", "Deer", "Fox", "Hawk", "Eagle",
    "Wolf", "Bear", "Elk", "Bell", "Mar", "Wood", "Ridge", "Pleasant", "Harmony", "Liberty",
    "Union", "Franklin", "Clinton", "Madison", "Jackson", "Lincoln", "Warren", "Marion", "Salem",
    "Avon", "Milton", "Ashton", "Carroll", "Dayton", "Bristol", "Chester", "Granite",
)  # fmt: skip
_CITY_SUFFIXES = (
    "", "ville", "ton", "field", "wood", "burg", "port", "dale", "ford", "land", "view", "mont",
    " City", " Springs", " Falls", " Park", " Heights", " Creek", " Grove", " Valley", " Point",
    " Junction", " Hills", " Harbor",
)  # fmt: skip

_FIRST_YEAR, _LAST_YEAR = 2002, 2020
_CHIP_FROM_YEAR = 2015  # US chip (EMV) liability shift; before it cards were swiped.
# Relative transaction volume by hour of day: quiet at night, which is why night spend stands out.
_HOUR_WEIGHTS = (
    0.5, 0.3, 0.2, 0.15, 0.15, 0.3, 1, 2, 3, 4, 5, 6, 7, 6, 5, 5, 5, 6, 6, 5, 4, 3, 2, 1,
)  # fmt: skip
_ODD_HOURS_END = 6  # hours 0..5

# Row mix by channel; the rest are local purchases in the cardholder's home state.
_P_ONLINE = 0.11
_P_FOREIGN = 0.012
_P_TRAVEL = 0.08
_P_ERROR = 0.016
_P_REFUND = 0.008
_P_BURST_ROW = 0.004
_P_ONLINE_IN_BURST = 0.4  # stolen card details are mostly used card-not-present
_COMPROMISED_CARD_SHARE = 0.01

# Fraud log-odds contributions; the intercept is fitted afterwards to hit the requested rate.
_W_FOREIGN = 4.5
_W_ONLINE = 3.2
_W_ODD_HOUR = 3.0
_W_LARGE_AMOUNT = 2.5  # per unit of log(amount / $150), above $150
_W_ERROR = 2.0
_W_CARD_DETAIL_ERROR = 1.0
_W_RISKY_MCC = 2.5
_W_BURST = 8.0


# --------------------------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------------------------


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise InvalidArgumentError(f"{name} must be an integer >= {minimum}, got {number}")
    return number


def _check_rate(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidArgumentError(f"{name} must be a number strictly between 0 and 1, got {value!r}")
    rate = float(value)
    if not (0.0 < rate < 1.0):  # also rejects NaN
        raise InvalidArgumentError(f"{name} must be strictly between 0 and 1, got {rate!r}")
    return rate


# --------------------------------------------------------------------------------------------
# generator
# --------------------------------------------------------------------------------------------


@functools.cache
def _city_name_pool() -> tuple[str, ...]:
    return tuple(
        f"{lead}{root}{suffix}" for lead in _CITY_LEADS for root in _CITY_ROOTS for suffix in _CITY_SUFFIXES
    )


@functools.cache
def _mcc_table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(codes, merchant-share probabilities, median ticket in cents)."""
    codes = [c for c, _, _ in _MCC_HEAD] + [c for c, _ in _MCC_TAIL]
    shares = [s for _, s, _ in _MCC_HEAD] + [_MCC_TAIL_SHARE] * len(_MCC_TAIL)
    medians = [m for _, _, m in _MCC_HEAD] + [m for _, m in _MCC_TAIL]
    if len(set(codes)) != len(codes):  # pragma: no cover - guards edits to the tables above
        raise AssertionError("duplicate MCC in the generator's tables")
    p = np.asarray(shares, dtype=np.float64)
    return np.asarray(codes, dtype=np.int64), p / p.sum(), np.asarray(medians, dtype=np.float64) * 100.0


@functools.cache
def _error_table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cell strings, probabilities, card-detail flag) for singles and alphabetical pairs."""
    kinds = [k for k, _ in _ERROR_KINDS]
    weights = np.asarray([w for _, w in _ERROR_KINDS], dtype=np.float64)
    weights = weights / weights.sum()
    cells: list[str] = []
    probs: list[float] = []
    detail: list[bool] = []
    pair_total = sum(weights[i] * weights[j] for i in range(len(kinds)) for j in range(i + 1, len(kinds)))
    for i, kind in enumerate(kinds):
        cells.append(f"{kind},")
        probs.append(0.95 * weights[i])
        detail.append(kind in _CARD_DETAIL_ERRORS)
    for i in range(len(kinds)):
        for j in range(i + 1, len(kinds)):
            cells.append(f"{kinds[i]},{kinds[j]},")
            probs.append(0.05 * weights[i] * weights[j] / pair_total)
            detail.append(kinds[i] in _CARD_DETAIL_ERRORS or kinds[j] in _CARD_DETAIL_ERRORS)
    p = np.asarray(probs)
    return np.asarray(cells, dtype=object), p / p.sum(), np.asarray(detail, dtype=bool)


@functools.cache
def _time_strings() -> np.ndarray:
    return np.asarray([f"{m // 60:02d}:{m % 60:02d}" for m in range(24 * 60)], dtype=object)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # tanh form: no overflow warnings for large |x|, unlike 1 / (1 + exp(-x)).
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _fit_intercept(logits: np.ndarray, rate: float) -> float:
    """The b with mean(sigmoid(b + logits)) == rate, by bisection (the mean is monotone in b)."""
    target = math.log(rate / (1.0 - rate))
    # At lo every row's probability is below rate, at hi every row's is above: a valid bracket.
    lo = target - float(logits.max()) - 1.0
    hi = target - float(logits.min()) + 1.0
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        if float(_sigmoid(mid + logits).mean()) < rate:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _format_amounts(cents: np.ndarray) -> np.ndarray:
    """``"$134.09"`` / ``"$-64.00"`` strings from integer cents, without a per-row Python loop."""
    magnitude = np.abs(cents)
    prefix = np.where(cents < 0, "$-", "$")
    fraction = np.asarray([f".{c:02d}" for c in range(100)])
    out = np.strings.add(prefix, (magnitude // 100).astype(np.str_))
    return np.strings.add(out, fraction[magnitude % 100])


def _str_series(values: np.ndarray) -> pd.Series:
    return pd.Series(values, dtype=_STR, copy=False)


def generate_transactions(
    n_rows: int,
    *,
    seed: int = 0,
    fraud_rate: float = 0.02,
    n_users: int = 2000,
) -> pd.DataFrame:
    """Synthetic TabFormer-style card transactions with a learnable fraud label.

    Parameters
    ----------
    n_rows
        number of transactions (>= 1).
    seed
        seed of the numpy random generator; the same seed gives an identical frame.
    fraud_rate
        the expected share of ``"Yes"`` labels, strictly between 0 and 1 (the real
        data has about 0.0012; the default is higher so small samples hold enough fraud).
    n_users
        number of cardholders; each has 1 to 9 cards numbered 0..8.

    Returns
    -------
    pandas.DataFrame
        The :data:`TABFORMER_COLUMNS`, in order, with exactly the dtypes
        :func:`load_tabformer_csv` gives (see the module docstring), sorted by User, Card and
        time like the real file, with a fresh RangeIndex.

    Raises
    ------
    InvalidArgumentError
        (a ``ValueError``) naming the parameter that is out of range.

    Notes
    -----
    The world is fixed per call: merchants (their number grows with ``n_rows``: 50,000 at a
    million rows) each have one MCC and one city/state/zip; online merchants have Merchant City
    ``"ONLINE"`` and no state or zip; foreign ones a country name as state and no zip. Users
    shop mostly in their home state. Fraud is drawn per row from log-odds that rise with foreign
    and online merchants, night hours (0-5), large amounts, errors, risky MCCs, and a burst
    month of a small set of compromised cards; the intercept is fitted so the expected rate is
    ``fraud_rate``.
    """
    n = _check_int("n_rows", n_rows, 1)
    n_users = _check_int("n_users", n_users, 1)
    rate = _check_rate("fraud_rate", fraud_rate)
    rng = np.random.default_rng(seed)

    # ---- the world: states, cities, merchants ------------------------------------------------
    state_codes = np.asarray([s for s, _, _ in _STATES], dtype=object)
    state_pop = np.asarray([p for _, p, _ in _STATES])
    state_pop = state_pop / state_pop.sum()
    state_zip_digit = np.asarray([d for _, _, d in _STATES], dtype=np.int64)
    n_states = len(_STATES)

    n_merchants = int(np.clip(n * 0.05, 200, 100_000))
    n_foreign = max(len(_FOREIGN_CITIES), round(0.03 * n_merchants))
    n_online = max(1, round(0.12 * n_merchants))
    n_phys = n_merchants - n_foreign - n_online
    n_cities = int(np.clip(n_phys // 7, n_states, 8000))

    # The first n_states cities cover every state and the first n_cities merchants every city,
    # so that "shop in your home state" always has somewhere to go.
    city_state = np.concatenate([np.arange(n_states), rng.choice(n_states, n_cities - n_states, p=state_pop)])
    pool = _city_name_pool()
    city_name = np.asarray(pool, dtype=object)[rng.choice(len(pool), n_cities, replace=False)]
    digit = state_zip_digit[city_state]
    city_zip = digit * 10_000 + rng.integers(np.where(digit == 0, 1000, 100), 9970)
    city_size = rng.lognormal(0.0, 1.0, n_cities)
    merchant_city = np.concatenate(
        [np.arange(n_cities), rng.choice(n_cities, n_phys - n_cities, p=city_size / city_size.sum())]
    )
    # Grouping physical merchants by state lets a row pick "a merchant in state s" as an offset.
    merchant_city = merchant_city[np.argsort(city_state[merchant_city], kind="stable")]
    phys_state = city_state[merchant_city]
    state_count = np.bincount(phys_state, minlength=n_states)
    state_start = np.concatenate([[0], np.cumsum(state_count)[:-1]])

    foreign_city = np.concatenate(
        [
            np.arange(len(_FOREIGN_CITIES)),
            rng.integers(0, len(_FOREIGN_CITIES), n_foreign - len(_FOREIGN_CITIES)),
        ]
    )
    foreign_names = np.asarray([c for c, _ in _FOREIGN_CITIES], dtype=object)
    foreign_countries = np.asarray([k for _, k in _FOREIGN_CITIES], dtype=object)

    # Merchant layout: [physical US, grouped by state][online][foreign].
    m_city = np.concatenate(
        [city_name[merchant_city], np.full(n_online, _ONLINE_CITY, dtype=object), foreign_names[foreign_city]]
    )
    m_state = np.concatenate(
        [state_codes[phys_state], np.full(n_online, np.nan, dtype=object), foreign_countries[foreign_city]]
    )
    phys_zip = np.minimum(
        city_zip[merchant_city] + rng.integers(0, 30, n_phys), digit[merchant_city] * 10_000 + 9999
    )
    m_zip = np.concatenate([phys_zip.astype(np.float64), np.full(n_online + n_foreign, np.nan)])
    mcc_codes, mcc_p, mcc_median_cents = _mcc_table()
    m_mcc = rng.choice(len(mcc_codes), n_merchants, p=mcc_p)
    info = np.iinfo(np.int64)
    while True:  # a collision among 64-bit ids is astronomically rare, but ids must be unique
        m_name = rng.integers(info.min, info.max, n_merchants, dtype=np.int64, endpoint=True)
        if np.unique(m_name).size == n_merchants:
            break

    # ---- cardholders, cards, compromised cards ----------------------------------------------
    cards_per_user = rng.choice(
        np.arange(1, 10), n_users, p=[0.3, 0.25, 0.18, 0.1, 0.07, 0.04, 0.03, 0.02, 0.01]
    )
    card_offset = np.concatenate([[0], np.cumsum(cards_per_user)[:-1]])
    n_cards = int(cards_per_user.sum())
    home_state = rng.choice(n_states, n_users, p=state_pop)
    activity = rng.lognormal(0.0, 0.5, n_users)

    n_compromised = max(1, round(_COMPROMISED_CARD_SHARE * n_cards))
    comp_flat = rng.choice(n_cards, n_compromised, replace=False)
    comp_user = np.searchsorted(card_offset, comp_flat, side="right") - 1
    comp_card = comp_flat - card_offset[comp_user]
    n_years = _LAST_YEAR - _FIRST_YEAR + 1
    comp_year = rng.integers(_FIRST_YEAR, _LAST_YEAR + 1, n_compromised)
    comp_month = rng.integers(1, 13, n_compromised)
    comp_day = rng.integers(1, 26, n_compromised)

    # ---- rows ----------------------------------------------------------------------------
    user = rng.choice(n_users, n, p=activity / activity.sum())
    # Card 0 is the everyday card; later cards see less use.
    card = (rng.random(n) ** 1.5 * cards_per_user[user]).astype(np.int64)
    year_w = 1.0 + 0.1 * np.arange(n_years)  # card use grows over the years
    year = _FIRST_YEAR + rng.choice(n_years, n, p=year_w / year_w.sum())
    month = rng.integers(1, 13, n)
    day = rng.integers(1, 29, n)

    burst = rng.random(n) < _P_BURST_ROW
    which = rng.integers(0, n_compromised, n)[burst]
    user[burst] = comp_user[which]
    card[burst] = comp_card[which]
    year[burst] = comp_year[which]
    month[burst] = comp_month[which]
    day[burst] = comp_day[which] + rng.integers(0, 4, which.size)

    hours = np.asarray(_HOUR_WEIGHTS)
    hour = rng.choice(24, n, p=hours / hours.sum())
    minute_of_day = hour * 60 + rng.integers(0, 60, n)

    # Channel: online / foreign / travel elsewhere in the US / local in the home state.
    u = rng.random(n)
    p_online = np.where(burst, _P_ONLINE_IN_BURST, _P_ONLINE)
    is_online = u < p_online
    is_foreign = ~is_online & (u < p_online + _P_FOREIGN)
    is_travel = ~is_online & ~is_foreign & (u < p_online + _P_FOREIGN + _P_TRAVEL)
    is_local = ~(is_online | is_foreign | is_travel)
    pick = rng.random(n)
    merchant = np.empty(n, dtype=np.int64)
    hs = home_state[user[is_local]]
    # Powers of a uniform give a few popular merchants and a long tail within each pool.
    merchant[is_local] = state_start[hs] + (pick[is_local] ** 1.2 * state_count[hs]).astype(np.int64)
    merchant[is_travel] = (pick[is_travel] * n_phys).astype(np.int64)
    merchant[is_online] = n_phys + (pick[is_online] ** 2 * n_online).astype(np.int64)
    merchant[is_foreign] = n_phys + n_online + (pick[is_foreign] * n_foreign).astype(np.int64)

    chip = np.where(
        is_online, _ONLINE, np.where((year >= _CHIP_FROM_YEAR) & (rng.random(n) < 0.8), _CHIP, _SWIPE)
    )

    mcc_idx = m_mcc[merchant]
    cents = np.maximum(1, np.rint(rng.lognormal(np.log(mcc_median_cents[mcc_idx]), 0.85))).astype(np.int64)
    refund = rng.random(n) < _P_REFUND
    cents[refund] = -np.maximum(100, cents[refund] // 100 * 100)  # refunds are whole dollars

    error_cells, error_p, error_detail = _error_table()
    has_error = rng.random(n) < _P_ERROR
    error_idx = np.full(n, -1, dtype=np.int64)
    error_idx[has_error] = rng.choice(len(error_cells), int(has_error.sum()), p=error_p)

    # ---- fraud label --------------------------------------------------------------------
    comp_keys = (comp_flat * n_years + (comp_year - _FIRST_YEAR)) * 12 + (comp_month - 1)
    row_keys = ((card_offset[user] + card) * n_years + (year - _FIRST_YEAR)) * 12 + (month - 1)
    in_burst = np.isin(row_keys, comp_keys)
    large = np.log(np.maximum(cents, 1) / 15_000.0).clip(min=0.0)
    logits = (
        _W_FOREIGN * is_foreign
        + _W_ONLINE * is_online
        + _W_ODD_HOUR * (hour < _ODD_HOURS_END)
        + _W_LARGE_AMOUNT * large
        + _W_ERROR * has_error
        + _W_CARD_DETAIL_ERROR * (has_error & error_detail[np.maximum(error_idx, 0)])
        + _W_RISKY_MCC * np.isin(mcc_codes[mcc_idx], _RISKY_MCCS)
        + _W_BURST * in_burst
    )
    prob = _sigmoid(_fit_intercept(logits, rate) + logits)
    fraud = rng.random(n) < prob

    # ---- assemble, in the real file's order: by card, then time -----------------------------
    order = np.argsort(
        ((((user * 9 + card) * n_years + (year - _FIRST_YEAR)) * 12 + (month - 1)) * 28 + (day - 1)) * 1440
        + minute_of_day,
        kind="stable",
    )
    merchant = merchant[order]
    error_idx = error_idx[order]
    errors = np.where(error_idx >= 0, error_cells[np.maximum(error_idx, 0)], np.nan)
    columns: dict[str, Any] = {
        "User": user[order].astype(np.int64),
        "Card": card[order].astype(np.int64),
        "Year": year[order].astype(np.int64),
        "Month": month[order].astype(np.int64),
        "Day": day[order].astype(np.int64),
        "Time": _str_series(_time_strings()[minute_of_day[order]]),
        "Amount": _str_series(_format_amounts(cents[order])),
        "Use Chip": _str_series(np.asarray(_USE_CHIP_KINDS, dtype=object)[chip[order]]),
        "Merchant Name": m_name[merchant],
        "Merchant City": _str_series(m_city[merchant]),
        "Merchant State": _str_series(m_state[merchant]),
        "Zip": m_zip[merchant],
        "MCC": mcc_codes[mcc_idx[order]],
        "Errors?": _str_series(errors),
        LABEL_COLUMN: _str_series(np.where(fraud[order], "Yes", "No").astype(object)),
    }
    return pd.DataFrame(columns, columns=list(TABFORMER_COLUMNS))


# --------------------------------------------------------------------------------------------
# CSV I/O
# --------------------------------------------------------------------------------------------


def write_tabformer_csv(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write ``frame`` as a TabFormer CSV file and return its path.

    The layout is the real file's: the :data:`TABFORMER_COLUMNS` header in order, Zip as a float
    (``"91750.0"``), empty cells for missing values, Amount written as given, UTF-8. Extra columns
    in ``frame`` are left out. Missing parent directories are created.

    Raises
    ------
    InvalidArgumentError
        ``frame`` lacks one of the TabFormer columns (named in the message).
    """
    missing = [c for c in TABFORMER_COLUMNS if c not in frame.columns]
    if missing:
        raise InvalidArgumentError(f"cannot write a TabFormer CSV: the frame has no column(s) {missing}")
    out = frame.loc[:, list(TABFORMER_COLUMNS)]
    # The real file writes zips as floats; an int or string Zip column would lose the ".0".
    out = out.assign(Zip=pd.to_numeric(out["Zip"]).astype(np.float64))
    target = Path(os.fspath(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    out.to_csv(target, index=False, encoding="utf-8", lineterminator="\n", na_rep="")
    return target


def _read_kwargs() -> dict[str, Any]:
    return {
        "usecols": list(TABFORMER_COLUMNS),
        "dtype": _CSV_DTYPES,
        # Only an empty cell is missing: "NA" or "None" could be legitimate text.
        "keep_default_na": False,
        "na_values": [""],
        "encoding": "utf-8",
    }


def _check_header(path: Path) -> None:
    try:
        header = pd.read_csv(path, nrows=0, encoding="utf-8")
    except pd.errors.EmptyDataError:
        raise InvalidArgumentError(f"{path} is empty; expected a TabFormer CSV with a header row") from None
    except (UnicodeDecodeError, pd.errors.ParserError) as exc:
        raise InvalidArgumentError(f"{path} is not a readable TabFormer CSV file: {exc}") from exc
    found = [str(c) for c in header.columns]
    missing = [c for c in TABFORMER_COLUMNS if c not in found]
    if missing:
        extra = [c for c in found if c not in TABFORMER_COLUMNS]
        hints = []
        for name in missing:
            close = difflib.get_close_matches(name, extra, n=1)
            if close:
                hints.append(f"{close[0]!r} -> {name!r}?")
        hint = f" (did you mean: {', '.join(hints)})" if hints else ""
        raise InvalidArgumentError(
            f"{path} is not a TabFormer transactions file: missing column(s) "
            f"{', '.join(repr(c) for c in missing)}{hint}; found {found}"
        )


def _finish(frame: pd.DataFrame) -> pd.DataFrame:
    # usecols keeps the file's order; downstream code relies on TABFORMER_COLUMNS order.
    if list(frame.columns) != list(TABFORMER_COLUMNS):
        frame = frame.loc[:, list(TABFORMER_COLUMNS)]
    return frame


def _iter_chunks(path: Path, nrows: int | None, chunksize: int) -> Iterator[pd.DataFrame]:
    # The reader is opened on first use, so an iterator that is never consumed holds no file.
    try:
        with pd.read_csv(path, nrows=nrows, chunksize=chunksize, **_read_kwargs()) as reader:
            for chunk in reader:
                yield _finish(chunk)
    except (ValueError, pd.errors.ParserError) as exc:
        raise InvalidArgumentError(f"{path}: malformed TabFormer data: {exc}") from exc


@overload
def load_tabformer_csv(
    path: str | os.PathLike[str], *, nrows: int | None = ..., chunksize: None = ...
) -> pd.DataFrame: ...
@overload
def load_tabformer_csv(
    path: str | os.PathLike[str], *, nrows: int | None = ..., chunksize: int
) -> Iterator[pd.DataFrame]: ...
def load_tabformer_csv(
    path: str | os.PathLike[str],
    *,
    nrows: int | None = None,
    chunksize: int | None = None,
) -> pd.DataFrame | Iterator[pd.DataFrame]:
    """Read the TabFormer transactions CSV (``card_transaction.v1.csv`` or
    ``credit_card_transactions-ibm_v2.csv``; a compressed ``.csv.gz``/``.zip`` works too).

    Parameters
    ----------
    path
        the CSV file.
    nrows
        read only the first ``nrows`` data rows.
    chunksize
        when given, return an iterator of frames of at most this many rows instead of
        one frame, for files that do not fit in memory. The chunks' indexes continue one
        another, so concatenating them gives the frame a plain read would.

    Returns
    -------
    pandas.DataFrame or Iterator[pandas.DataFrame]
        A frame (or, with ``chunksize``, an iterator of frames) with the :data:`TABFORMER_COLUMNS`
        in order and the dtypes described in the module docstring. Extra columns in the file are
        dropped.

    Raises
    ------
    NotFoundError
        there is no file at ``path``.
    InvalidArgumentError
        the header lacks a TabFormer column (the message names the missing
        columns and the file), the file is empty, or a value does not parse (for example a
        non-integer User). With ``chunksize`` the header is checked at once; a bad value is
        reported when its chunk is read.
    """
    file = Path(os.fspath(path))
    if nrows is not None:
        nrows = _check_int("nrows", nrows, 1)
    if chunksize is not None:
        chunksize = _check_int("chunksize", chunksize, 1)
    if not file.is_file():
        raise NotFoundError(f"TabFormer CSV file not found: {file}")
    _check_header(file)
    if chunksize is not None:
        return _iter_chunks(file, nrows, chunksize)
    try:
        frame = pd.read_csv(file, nrows=nrows, **_read_kwargs())
    except (ValueError, pd.errors.ParserError) as exc:
        raise InvalidArgumentError(f"{file}: malformed TabFormer data: {exc}") from exc
    return _finish(frame)


# --------------------------------------------------------------------------------------------
# labels
# --------------------------------------------------------------------------------------------


def label_array(frame: pd.DataFrame) -> np.ndarray:
    """The :data:`LABEL_COLUMN` as an ``int8`` array: ``"Yes"`` -> 1, ``"No"`` -> 0.

    Raises
    ------
    InvalidArgumentError
        the column is absent, or holds anything else (another spelling,
        a missing value); the message names the column and the first bad value.
    """
    if LABEL_COLUMN not in frame.columns:
        raise InvalidArgumentError(f"no label column {LABEL_COLUMN!r} in the frame")
    values = frame[LABEL_COLUMN]
    yes = (values == "Yes").to_numpy(dtype=bool, na_value=False)
    no = (values == "No").to_numpy(dtype=bool, na_value=False)
    bad = ~(yes | no)
    if bad.any():
        first = values.iloc[int(np.argmax(bad))]
        raise InvalidArgumentError(
            f"column {LABEL_COLUMN!r} must hold only 'Yes' or 'No'; found {first!r} "
            f"({int(bad.sum())} bad value(s))"
        )
    return yes.astype(np.int8)
