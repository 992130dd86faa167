"""Tests for agent.act.remote_write.wire: the WriteRequest bytes, against the spec's layout and protobuf's decoder."""

from __future__ import annotations

import math
import struct

import pytest

from agent.act.remote_write.wire import CONTENT_HEADERS, Encoder, WriteRequest, compress, decode, decompress
from agent.series import STALE_NAN, labels_from

UP = labels_from("up", {"job": "x"})


def varint(n: int) -> bytes:
    """Protobuf's base-128 varint, written out here independently of the encoder under test."""
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes) -> bytes:
    key = varint(number << 3 | wire_type)
    return key + (varint(len(payload)) + payload if wire_type == 2 else payload)


def test_one_sample_has_the_spec_byte_layout() -> None:
    """up{job="x"} 1 @1000ms is WriteRequest{timeseries: [{labels: [__name__, job], samples: [{1.0, 1000}]}]}
    with the field numbers and wire types of prompb, byte for byte."""
    label = lambda k, v: field(1, 2, field(1, 2, k.encode()) + field(2, 2, v.encode()))  # noqa: E731
    sample = field(2, 2, field(1, 1, struct.pack("<d", 1.0)) + field(2, 0, varint(1000)))
    expected = field(1, 2, label("__name__", "up") + label("job", "x") + sample)
    got = Encoder().encode([(UP, 1.0, 1000)])
    assert got == expected
    # 0a 28: timeseries, 40 bytes | 0a 0e 0a 08 "__name__" 12 02 "up" | 0a 08 0a 03 "job" 12 01 "x"
    # | 12 0c: samples, 12 bytes: 09 <1.0 as little-endian double> 10 e8 07 (1000 as a varint)
    assert got.hex() == ("0a28" "0a0e0a085f5f6e616d655f5f12027570" "0a080a036a6f62120178"
                         "120c09000000000000f03f10e807")


def test_protobuf_decodes_labels_sorted_with_name_and_samples_in_order() -> None:
    """Each sample is its own TimeSeries, in the order given, labels sorted by name with __name__ among them."""
    kv = labels_from("job_model:kv_cache_usage:avg", {"model": "llama", "job": "vllm"})
    rows = [(kv, 0.5, 1_700_000_000_000), (UP, 0.0, 1_700_000_000_001), (kv, 0.75, 1_700_000_015_000)]
    req = WriteRequest()
    req.ParseFromString(Encoder().encode(rows))
    assert [[(lb.name, lb.value) for lb in ts.labels] for ts in req.timeseries] == [
        [("__name__", "job_model:kv_cache_usage:avg"), ("job", "vllm"), ("model", "llama")],
        [("__name__", "up"), ("job", "x")],
        [("__name__", "job_model:kv_cache_usage:avg"), ("job", "vllm"), ("model", "llama")],
    ]
    assert [[(s.timestamp, s.value) for s in ts.samples] for ts in req.timeseries] == [
        [(1_700_000_000_000, 0.5)], [(1_700_000_000_001, 0.0)], [(1_700_000_015_000, 0.75)]]


def test_external_labels_are_added_in_order_and_never_override() -> None:
    """An external label joins the sorted labels; one the series has already keeps the series' value."""
    enc = Encoder({"replica": "a", "job": "other", "aaa": "1"})
    [(labels, _)] = decode(enc.encode([(UP, 1.0, 5)]), compressed=False)
    assert labels == (("__name__", "up"), ("aaa", "1"), ("job", "x"), ("replica", "a"))


def test_staleness_marker_keeps_its_bit_pattern() -> None:
    """Prometheus' staleness NaN (0x7ff0000000000002) arrives as that NaN, not any NaN."""
    [(_, [(ts, value)])] = decode(Encoder().encode([(UP, STALE_NAN, 7)]), compressed=False)
    assert ts == 7 and math.isnan(value)
    assert struct.pack("<d", value).hex() == struct.pack("<Q", 0x7FF0000000000002).hex()


def test_joined_requests_are_one_request() -> None:
    """The queue sends several batches as one by joining their bytes: protobuf parses that as one list."""
    enc = Encoder()
    a, b = enc.encode([(UP, 1.0, 1)]), enc.encode([(UP, 2.0, 2), (UP, 3.0, 3)])
    assert [s for _, s in decode(a + b, compressed=False)] == [[(1, 1.0)], [(2, 2.0)], [(3, 3.0)]]


def test_body_is_a_snappy_block_with_the_length_first() -> None:
    """Snappy's block format (what remote write means), not its framed stream: a varint of the raw length
    first, no stream identifier chunk."""
    raw = Encoder().encode([(UP, float(i), i) for i in range(300)])
    body = compress(raw)
    assert body.startswith(varint(len(raw)))
    assert not body.startswith(b"\xff\x06\x00\x00sNaPpY")
    assert decompress(body) == raw
    assert len(body) < len(raw) / 3  # repeated labels compress well


def test_garbage_is_refused() -> None:
    """A body that is not snappy, or not a WriteRequest, is a ValueError naming which."""
    with pytest.raises(ValueError, match="snappy"):
        decompress(b"\x05not snappy at all")
    with pytest.raises(ValueError, match="WriteRequest"):
        decode(b"\x0a\xff\xff", compressed=False)


def test_label_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-series label cache starts over at its bound instead of growing with churn."""
    monkeypatch.setattr("agent.act.remote_write.wire._CACHE_MAX", 10)
    enc = Encoder()
    rows = [(labels_from("m", {"i": str(i)}), 1.0, i) for i in range(25)]
    assert len(decode(enc.encode(rows), compressed=False)) == 25
    assert len(enc._labels) <= 10


def test_headers_are_the_protocols() -> None:
    """Remote write 1.0's three required headers."""
    assert CONTENT_HEADERS == {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                               "X-Prometheus-Remote-Write-Version": "0.1.0"}
