"""The judge's channel to the executor (sanitizer/wire.py): what the untrusted side sends is validated
before the judge allocates or builds a tensor from it, and nothing is unpickled."""

import json
import socket
import struct

import pytest
import torch

from kernel_agent.sanitizer import wire


def _pair():
    a, b = socket.socketpair()
    b.settimeout(5)
    return a, b


def test_a_strided_view_travels_with_its_whole_storage():
    a, b = _pair()
    base = torch.arange(24, dtype=torch.float32)
    view = base.as_strided((3, 2), (5, 2), 3)
    wire.send(a, {"cmd": "x"}, [view])
    header, [got] = wire.recv(b)
    assert header["cmd"] == "x" and got.stride() == (5, 2) and got.storage_offset() == 3
    assert torch.equal(got, view) and wire.digest(got) == wire.digest(view)


def test_views_of_one_storage_arrive_as_views_of_one_storage():
    """vLLM's `kv[0]` and `kv[1]` (or slices of one fused QKV) reach the other side sharing their storage, which
    travels once; tensors of storages of their own stay apart."""
    a, b = _pair()
    kv = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 3, 4)
    other = torch.zeros(5, dtype=torch.int32)
    wire.send(a, {}, [kv[0], other, kv[1]])
    _, [k, o, v] = wire.recv(b)
    assert torch.equal(k, kv[0]) and torch.equal(v, kv[1]) and torch.equal(o, other)
    assert k.untyped_storage().data_ptr() == v.untyped_storage().data_ptr() != o.untyped_storage().data_ptr()
    assert v.storage_offset() == 12


@pytest.mark.parametrize("of", [0, 1, -1, "0"])
def test_a_shared_storage_must_name_an_earlier_tensor(of):
    desc = {"dtype": "float32", "shape": [1], "stride": [1], "offset": 0, "nbytes": 0, "storage_of": of}
    a, b = _pair()
    body = json.dumps({"tensors": [desc]}).encode()
    a.sendall(struct.pack("<QQ", len(body), 0) + body)
    with pytest.raises(wire.WireError, match="malformed shared storage"):
        wire.recv(b)


def _raw(header: dict, payload: bytes = b"") -> bytes:
    body = json.dumps(header).encode()
    return struct.pack("<QQ", len(body), len(payload)) + body + payload


@pytest.mark.parametrize(
    "header,payload,error",
    [
        (
            {"tensors": [{"dtype": "object", "shape": [1], "stride": [1], "offset": 0, "nbytes": 4}]},
            b"\0" * 4,
            "not allowed",
        ),
        (
            {"tensors": [{"dtype": "float32", "shape": [4], "stride": [1], "offset": 2, "nbytes": 8}]},
            b"\0" * 8,
            "past its storage",
        ),
        (
            {"tensors": [{"dtype": "float32", "shape": [1], "stride": [1], "offset": 0, "nbytes": 8}]},
            b"\0" * 4,
            "does not match",
        ),
    ],
)
def test_malformed_tensors_are_refused(header, payload, error):
    a, b = _pair()
    a.sendall(_raw(header, payload))
    with pytest.raises(wire.WireError, match=error):
        wire.recv(b)


def test_an_oversized_answer_is_refused_before_anything_is_allocated():
    a, b = _pair()
    a.sendall(struct.pack("<QQ", 10, 1 << 40))
    with pytest.raises(wire.WireError, match="too large"):
        wire.recv(b, max_payload=1 << 20)


def test_a_closed_or_silent_peer_is_an_error_not_a_hang():
    a, b = _pair()
    b.settimeout(0.2)
    with pytest.raises(wire.WireError, match="in time"):
        wire.recv(b)
    a.close()
    with pytest.raises(wire.WireError, match="closed"):
        wire.recv(b)


def test_a_duration_from_the_untrusted_side_that_is_not_a_finite_number_counts_as_too_long():
    import math

    from kernel_agent.sanitizer import wire

    assert wire.seconds(2.5) == 2.5 and wire.seconds(0) == 0.0
    for bad in (float("nan"), float("inf"), -1.0, True, "3", None, [1]):
        assert wire.seconds(bad) == math.inf, bad
