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
