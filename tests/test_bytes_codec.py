"""The BYTES codec of the wire and of process instances' shared memory: Triton's layout, each
element a 4-byte little-endian length and then its bytes, and malformed data told in Triton's terms."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from triton_nb.errors import InvalidArgumentError
from triton_nb.tensors import deserialize_bytes, serialize_bytes


@pytest.mark.parametrize("count", [0, 1, 2, 33])
def test_elements_round_trip_in_triton_layout(count):
    values = np.array([b"", "é".encode(), b"\x00ab", b"x" * 300][:count] + [b"%d" % i for i in range(count - 4)],
                      dtype=object)[:count]
    blob = serialize_bytes(values)
    expected = b"".join(struct.pack("<I", len(v)) + v for v in values)
    assert blob == expected
    back = deserialize_bytes("m", "T", memoryview(blob), count)
    assert back.dtype == object and back.tolist() == values.tolist()
    assert all(type(v) is bytes for v in back)


def test_str_elements_are_sent_as_utf8():
    assert serialize_bytes(np.array([["é", b"b"]], dtype=object)) == b"\x02\x00\x00\x00\xc3\xa9\x01\x00\x00\x00b"


@pytest.mark.parametrize(("blob", "count", "message"), [
    (struct.pack("<I", 1) + b"a", 3, "holds fewer than the 3 elements its shape needs"),
    (struct.pack("<I", 1) + b"a" + struct.pack("<I", 100) + b"bc", 2, "element 1 says 100 bytes; the data ends before"),
    (struct.pack("<I", 1) + b"a" + b"\x01\x00", 1, "has 2 bytes left over after 1 elements"),
    (struct.pack("<I", 1) + b"a" * 2 + struct.pack("<I", 0), 2, "element 1 says 97 bytes; the data ends before"),
    (b"\x01", 2, "holds fewer than the 2 elements"),
])
def test_malformed_data_is_refused_naming_model_and_tensor(blob, count, message):
    with pytest.raises(InvalidArgumentError, match=f"model 'm': BYTES input 'T' .*{message}"):
        deserialize_bytes("m", "T", blob, count)
