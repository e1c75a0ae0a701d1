#!/usr/bin/python3
"""An independent safetensors reader (numpy only), run by tests/test_checkpoint.c.

    /usr/bin/python3 tests/read_safetensors.py FILE SPEC.json

SPEC is {"tensors": {name: {"dtype": "F32"|"I32"|"BF16", "shape": [...],
"start": a, "step": b}}, "metadata": {...}, "exact": true}: each named tensor
must hold start + step * arange(numel) (in its dtype, reshaped), the file's
__metadata__ must equal "metadata", and with "exact" the file holds no other
tensor. The layout is checked as Hugging Face's reader checks it (offsets tile
the data with no gap) plus ctrax's alignment promises. Exits 0 when all holds.

scripts/soak.sh imports it: bitwise_diff(a, b) compares two files tensor by
tensor, bit for bit.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": ("<f4", 4), "I32": ("<i4", 4), "BF16": ("<u2", 2)}


def fail(msg):
    print(f"read_safetensors: FAIL: {msg}")
    sys.exit(1)


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        fail(f"{path}: too short")
    (hlen,) = struct.unpack("<Q", raw[:8])
    if 8 + hlen > len(raw):
        fail(f"{path}: header length {hlen} past the end")
    header = json.loads(raw[8 : 8 + hlen].decode("utf-8"))
    data = raw[8 + hlen :]
    if (8 + hlen) % 8 != 0:
        fail(f"{path}: data starts at {8 + hlen}, not 8-byte aligned")
    meta = header.pop("__metadata__", {})
    spans = sorted((v["data_offsets"][0], v["data_offsets"][1], k) for k, v in header.items())
    pos = 0
    for begin, end, name in spans:
        if begin != pos:
            fail(f"{path}: tensor {name!r} starts at {begin}, expected {pos} (gap or overlap)")
        pos = end
    if pos != len(data):
        fail(f"{path}: tensors cover {pos} of {len(data)} data bytes")
    tensors = {}
    for name, info in header.items():
        np_dtype, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        if begin % size != 0:
            fail(f"{path}: tensor {name!r} at offset {begin} is not aligned to {size}")
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64))
        if (end - begin) != count * size:
            fail(f"{path}: tensor {name!r} spans {end - begin} bytes for shape {shape}")
        arr = np.frombuffer(data, dtype=np_dtype, count=count, offset=begin).reshape(shape)
        if info["dtype"] == "BF16":
            arr = (arr.astype(np.uint32) << 16).view(np.float32)
        tensors[name] = (info["dtype"], shape, arr)
    return tensors, meta


def bitwise_diff(path_a, path_b):
    """The differences between two safetensors files, tensor by tensor, bit
    for bit (a NaN equals the same NaN; 0.0 differs from -0.0): a list of
    lines, empty when every tensor and the metadata are identical."""
    (ta, ma), (tb, mb) = read(path_a), read(path_b)
    out = []
    if ma != mb:
        out.append(f"metadata {ma} != {mb}")
    for name in sorted(set(ta) | set(tb)):
        if name not in ta or name not in tb:
            out.append(f"tensor {name!r} only in {path_a if name in ta else path_b}")
            continue
        (da, sa, a), (db, sb, b) = ta[name], tb[name]
        if (da, sa) != (db, sb):
            out.append(f"tensor {name!r}: {da} {sa} != {db} {sb}")
            continue
        # read() gives 4-byte elements (BF16 widened exactly): compare their bits.
        n = int(np.count_nonzero(a.view(np.uint32) != b.view(np.uint32)))
        if n:
            worst = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
            out.append(f"tensor {name!r}: {n} of {a.size} elements differ (max |diff| {worst:.3g})")
    return out


def main():
    path, spec_path = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    tensors, meta = read(path)
    if "metadata" in spec and meta != spec["metadata"]:
        fail(f"{path}: metadata {meta} != {spec['metadata']}")
    if spec.get("exact") and set(tensors) != set(spec["tensors"]):
        fail(f"{path}: tensors {sorted(tensors)} != {sorted(spec['tensors'])}")
    for name, want in spec["tensors"].items():
        if name not in tensors:
            fail(f"{path}: no tensor {name!r}")
        dtype, shape, arr = tensors[name]
        if dtype != want["dtype"] or list(shape) != want["shape"]:
            fail(f"{path}: tensor {name!r} is {dtype} {shape}, expected {want['dtype']} {want['shape']}")
        n = int(np.prod(shape, dtype=np.int64))
        kind = np.int32 if dtype == "I32" else np.float32
        expect = (want["start"] + want["step"] * np.arange(n, dtype=np.float64)).astype(kind).reshape(shape)
        if not np.array_equal(arr, expect):
            fail(f"{path}: tensor {name!r} holds {arr.ravel()[:8]}..., expected {expect.ravel()[:8]}...")
    print(f"read_safetensors: {len(spec['tensors'])} tensors checked by name in {path}")


if __name__ == "__main__":
    main()
