"""The channel between the trusted judge and the sandboxed executor that runs a candidate.

A message is a JSON header and raw tensor storages, framed by lengths. Nothing is
unpickled: the judge only ever parses JSON and copies bytes into tensors of an allowed
dtype, shape and stride, and it validates sizes before it allocates. A tensor travels
with its whole storage and its view (shape, stride, offset), so strided inputs keep the
garbage between their elements and the executor sees exactly what the judge built.
"""

from __future__ import annotations

import hashlib
import json
import math
import socket
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

MAX_HEADER = 4 << 20
MAX_PAYLOAD = 64 << 30
WIRE_DTYPES = {
    str(d).replace("torch.", ""): d
    for d in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.uint8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    )
}


class WireError(Exception):
    """The peer broke the protocol, closed the channel, or did not answer in time."""


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        try:
            k = sock.recv_into(view[got:], n - got)
        except socket.timeout:
            raise WireError("no answer in time") from None
        except OSError as e:
            raise WireError(f"channel error: {e}") from None
        if k == 0:
            raise WireError("the other side closed the channel")
        got += k
    return buf


def describe(t: torch.Tensor) -> Dict[str, Any]:
    return {
        "dtype": str(t.dtype).replace("torch.", ""),
        "shape": list(t.shape),
        "stride": list(t.stride()),
        "offset": int(t.storage_offset()),
        "nbytes": int(t.untyped_storage().nbytes()),
    }


def storage_bytes(t: torch.Tensor) -> memoryview:
    """A view of a tensor's whole storage as bytes (a copy only when it lives on a device)."""
    st = t.untyped_storage()
    if st.device.type != "cpu":
        st = st.cpu()
    return memoryview(torch.empty(0, dtype=torch.uint8).set_(st).numpy()).cast("B")  # type: ignore[arg-type]


def digest(t: torch.Tensor) -> str:
    """A hash of a tensor's whole storage (the bytes around a strided view included)."""
    return hashlib.sha256(storage_bytes(t)).hexdigest()


def storage_key(t: torch.Tensor) -> Tuple[str, int]:
    """What tells two tensors' storages apart: its device and its address (views of one storage share it)."""
    st = t.untyped_storage()
    return (str(st.device), st.data_ptr())


def send(sock: socket.socket, header: Dict[str, Any], tensors: Sequence[torch.Tensor] = ()) -> None:
    """The header and the tensors. A storage shared by several tensors travels once, the later ones naming the
    first (`storage_of`), so the receiver's views share it as the sender's did: two views of one cache, or slices
    of one fused QKV, reach the other side as they were laid out."""
    descs: List[Dict[str, Any]] = []
    first: Dict[Tuple[str, int], int] = {}
    unique: List[torch.Tensor] = []
    for i, t in enumerate(tensors):
        d = describe(t)
        key = storage_key(t)
        if key in first and d["nbytes"]:
            d["storage_of"], d["nbytes"] = first[key], 0
        else:
            first.setdefault(key, i)
            unique.append(t)
        descs.append(d)
    header = dict(header, tensors=descs)
    body = json.dumps(header).encode()
    sock.sendall(struct.pack("<QQ", len(body), sum(d["nbytes"] for d in descs)) + body)
    for t in unique:
        sock.sendall(storage_bytes(t))


def _tensor(desc: Dict[str, Any], flat: torch.Tensor) -> torch.Tensor:
    """The view `desc` describes on a storage's bytes (`flat`: uint8, on the receiver's device)."""
    dtype = WIRE_DTYPES.get(desc.get("dtype", ""))
    if dtype is None:
        raise WireError(f"tensor of a dtype that is not allowed: {str(desc.get('dtype'))[:40]}")
    shape, stride, offset = desc.get("shape"), desc.get("stride"), desc.get("offset")
    if not (
        isinstance(shape, list)
        and isinstance(stride, list)
        and len(shape) == len(stride) <= 8
        and all(isinstance(x, int) and x >= 0 for x in shape + stride)
        and isinstance(offset, int)
        and offset >= 0
    ):
        raise WireError("malformed tensor description")
    esize = torch.empty(0, dtype=dtype).element_size()
    nbytes = flat.numel()
    if nbytes % esize:
        raise WireError("tensor storage is not a whole number of elements")
    if all(s > 0 for s in shape):
        last = offset + sum((s - 1) * st for s, st in zip(shape, stride))
        if (last + 1) * esize > nbytes:
            raise WireError("tensor view reaches past its storage")
    storage = flat.view(dtype) if nbytes else torch.empty(0, dtype=dtype, device=flat.device)
    return torch.as_strided(storage, shape, stride, offset)


def recv(
    sock: socket.socket, device: str = "cpu", max_payload: int = MAX_PAYLOAD
) -> Tuple[Dict[str, Any], List[torch.Tensor]]:
    hlen, plen = struct.unpack("<QQ", _recv_exact(sock, 16))
    if hlen > MAX_HEADER or plen > max_payload:
        raise WireError(f"message too large (header {hlen} bytes, payload {plen} bytes)")
    try:
        header = json.loads(_recv_exact(sock, hlen))
    except ValueError:
        raise WireError("the header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors", []), list):
        raise WireError("malformed header")
    descs = header.pop("tensors", [])
    if sum(int(d.get("nbytes", 0)) if isinstance(d, dict) else 0 for d in descs) != plen:
        raise WireError("payload length does not match the tensor descriptions")
    tensors: List[torch.Tensor] = []
    flats: List[torch.Tensor] = []
    for i, d in enumerate(descs):
        n = d.get("nbytes")
        of = d.get("storage_of") if isinstance(d, dict) else None
        if not isinstance(n, int) or n < 0:
            raise WireError("malformed tensor size")
        if of is not None:  # a view of an earlier tensor's storage (send)
            if not isinstance(of, int) or not 0 <= of < i or n:
                raise WireError("malformed shared storage")
            flat = flats[of]
        else:
            raw = _recv_exact(sock, n)
            flat = torch.frombuffer(raw, dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
            flat = flat.to(device) if device != "cpu" else flat
        flats.append(flat)
        tensors.append(_tensor(d, flat))
    return header, tensors


def text(value: Any, limit: int = 300) -> str:
    """A string from the untrusted side, bounded."""
    return str(value)[:limit] if value is not None else ""


def strings(value: Any, limit: int = 20) -> List[str]:
    return [text(v) for v in value[:limit]] if isinstance(value, list) else []


def as_int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def seconds(value: Any) -> float:
    """A duration from the untrusted side: a finite number of seconds, at least 0; anything else counts as too
    long (math.inf), so that a time limit holds it."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < math.inf
    return float(value) if ok else math.inf


def optional_list(value: Any) -> Optional[list]:
    return value if isinstance(value, list) else None
