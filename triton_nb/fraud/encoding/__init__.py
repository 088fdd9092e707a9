"""The fraud example's preprocessing as plain numpy: one implementation for the SDK and Triton.

:class:`FeatureEncoder` turns raw TabFormer transactions (a mapping of column name to array —
Triton's Python backend hands BYTES tensors over as object arrays of UTF-8 bytes shaped
``[batch, 1]`` — or a DataFrame) into the 15 float32 features of the example, given the sorted
class lists of its label encoders. :class:`triton_nb.fraud.FraudPreprocessor` wraps it in a
scikit-learn estimator; the exported preprocessing ``model.py`` ships this very package next to
it (as the folder ``fraud_encoding/``) and imports it, so what was tested is what real Triton
runs. That is why this package depends on numpy alone, imports nothing else from triton_nb, and
its modules import one another only relatively.

Values are handled as UTF-8 byte strings (numpy ``S`` arrays) throughout: Triton delivers them
that way, so serving never decodes, and UTF-8 preserves code-point order, so byte-sorted
classes are in the same order as the sorted strings the encoders store. A batch of more than
a hundred or so rows goes through whole-column numpy operations; a smaller one, where numpy's
cost per call would be the whole cost, through Python lists — the same rules, checked against
each other. Both look a category value up in a dictionary of every spelling met so far (the
classes and their TabFormer spellings from the start, then each value the rules have judged),
so a served value is judged by the rules once and looked up ever after.

The modules, each importing only those before it: :mod:`.columns` (the column names, reading
columns out of the input), :mod:`.text` (category text as bytes, its canonical forms, the
location rules), :mod:`.numeric` (numbers, amounts, times), :mod:`.spellings` (the tables of
spellings met so far), :mod:`.rows` (small batches as lists) and :mod:`.encoder`
(:class:`FeatureEncoder`, the whole-column path).
"""

from .columns import (
    ENCODED_COLUMNS,
    FEATURE_NAMES,
    RAW_INPUT_COLUMNS,
    UNKNOWN,
    US_STATE_CODES,
    FeatureInputError,
    gather_columns,
)
from .encoder import FeatureEncoder
from .numeric import check_numeric_columns
from .text import canonical_categories, canonical_category_arrays

__all__ = [
    "ENCODED_COLUMNS",
    "FEATURE_NAMES",
    "RAW_INPUT_COLUMNS",
    "UNKNOWN",
    "US_STATE_CODES",
    "FeatureEncoder",
    "FeatureInputError",
    "canonical_categories",
    "canonical_category_arrays",
    "check_numeric_columns",
    "gather_columns",
]
