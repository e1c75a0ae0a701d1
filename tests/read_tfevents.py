#!/usr/bin/python3
"""An independent TensorBoard event file reader, run by tests/test_summary.c.

    /usr/bin/python3 tests/read_tfevents.py FILE EXPECT.json

Parses the TFRecord framing (both masked CRC-32C checksums verified), decodes
the Event protos with a small protobuf decoder of its own, and checks: the
first record is file_version "brain.Event:2"; wall times are plausible and
non-decreasing; the scalar events are exactly EXPECT["scalars"] (a list of
{"tag", "step", "value"}, in order, values compared as float32); the
SessionLog START events are at EXPECT["session_starts"] (steps, in order).
Exits 0 when all holds.

scripts/soak.sh imports it: tensorboard_scalars(logdir) is what TensorBoard
shows of a log directory after its SessionLog START semantics.
"""
import json
import os
import struct
import sys
import time

import numpy as np


def fail(msg):
    print(f"read_tfevents: FAIL: {msg}")
    sys.exit(1)


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    """A varint as protobuf's serializers write it: in the fewest bytes (a
    last byte of 0 after others is padding no serializer writes)."""
    shift = value = 0
    start = i
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            if b == 0 and i - start > 1:
                fail(f"varint of {i - start} bytes for {value} is not in its shortest form")
            return value, i


def fields(buf):
    """Protobuf message -> list of (field number, wire type, value)."""
    out, i = [], 0
    while i < len(buf):
        key, i = varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v, i = buf[i : i + 8], i + 8
        elif wire == 2:
            n, i = varint(buf, i)
            v, i = buf[i : i + n], i + n
        elif wire == 5:
            v, i = buf[i : i + 4], i + 4
        else:
            fail(f"unexpected wire type {wire}")
        out.append((field, wire, v))
    if i != len(buf):
        fail("message runs past its end")
    return out


def records(path, tail_ok=False):
    """The data of each TFRecord of path. With tail_ok, a record cut short at
    the end of the file (a writer killed mid-write) ends the file, as
    TensorBoard's reader treats it; a checksum mismatch fails either way."""
    with open(path, "rb") as f:
        raw = f.read()
    i = 0
    while i < len(raw):
        if i + 12 > len(raw):
            if tail_ok:
                return
            fail(f"truncated record header at byte {i}")
        head = raw[i : i + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", raw[i + 8 : i + 12])
        if hcrc != masked(head):
            fail(f"length crc mismatch at byte {i}")
        data = raw[i + 12 : i + 12 + n]
        if len(data) != n or i + 16 + n > len(raw):
            if tail_ok:
                return
            fail(f"truncated record at byte {i}")
        (dcrc,) = struct.unpack("<I", raw[i + 12 + n : i + 16 + n])
        if dcrc != masked(data):
            fail(f"data crc mismatch at byte {i}")
        yield data
        i += 16 + n


def event(data):
    e = {"scalars": []}
    for field, wire, v in fields(data):
        if field == 1 and wire == 1:
            e["wall_time"] = struct.unpack("<d", v)[0]
        elif field == 2 and wire == 0:
            e["step"] = v - (1 << 64) if v >= 1 << 63 else v
        elif field == 3 and wire == 2:
            e["file_version"] = v.decode()
        elif field == 5 and wire == 2:
            for f2, w2, value in fields(v):
                if f2 != 1 or w2 != 2:
                    fail("unexpected Summary field")
                tag = simple = None
                for f3, w3, x in fields(value):
                    if f3 == 1 and w3 == 2:
                        tag = x.decode()
                    elif f3 == 2 and w3 == 5:
                        simple = struct.unpack("<f", x)[0]
                e["scalars"].append((tag, simple))
        elif field == 7 and wire == 2:  # session_log (6 is the deprecated log_message)
            e["session_log"] = dict((f2, x) for f2, _, x in fields(v))
        else:
            fail(f"unexpected Event field {field} (wire {wire})")
    return e


def event_files(logdir):
    """The event files of a TensorBoard log directory, in the order
    TensorBoard loads them (by name)."""
    return [os.path.join(logdir, n) for n in sorted(os.listdir(logdir)) if "tfevents" in n]


def tensorboard_scalars(logdir):
    """What TensorBoard shows for logdir: {tag: [(step, value), ...]} after
    its SessionLog START semantics (EventAccumulator with
    purge_orphaned_data): the event files are read in name order, and a START
    event at step s discards every scalar read so far with step >= s, of every
    tag. Also returns counts: files, starts, purged scalars, truncated tails."""
    shown, stats = {}, {"files": 0, "starts": 0, "purged": 0, "truncated": 0}
    for path in event_files(logdir):
        stats["files"] += 1
        with open(path, "rb") as f:
            size = len(f.read())
        end = 0
        for data in records(path, tail_ok=True):
            end += 16 + len(data)
            e = event(data)
            if "session_log" in e and e["session_log"].get(1) == 1:
                stats["starts"] += 1
                s = e.get("step", 0)
                for tag, rows in shown.items():
                    kept = [r for r in rows if r[0] < s]
                    stats["purged"] += len(rows) - len(kept)
                    shown[tag] = kept
            for tag, value in e["scalars"]:
                shown.setdefault(tag, []).append((e.get("step", 0), value))
        if end != size:
            stats["truncated"] += 1
    return shown, stats


def main():
    path, expect_path = sys.argv[1], sys.argv[2]
    with open(expect_path) as f:
        expect = json.load(f)
    events = [event(d) for d in records(path)]
    if not events or events[0].get("file_version") != "brain.Event:2":
        fail("the first record is not file_version brain.Event:2")
    now, last = time.time(), 0.0
    scalars, starts = [], []
    for e in events:
        wt = e.get("wall_time", 0.0)
        if not (now - 86400 < wt < now + 60) or wt < last:
            fail(f"implausible wall_time {wt}")
        last = wt
        for tag, value in e["scalars"]:
            scalars.append((tag, e.get("step", 0), value))
        if "session_log" in e:
            if e["session_log"].get(1) != 1:
                fail("a SessionLog that is not START")
            starts.append(e.get("step", 0))
    want = [(s["tag"], s["step"], float(np.float32(s["value"]))) for s in expect["scalars"]]
    if scalars != want:
        fail(f"scalars {scalars} != {want}")
    if starts != expect.get("session_starts", []):
        fail(f"session starts {starts} != {expect.get('session_starts', [])}")
    print(f"read_tfevents: {len(events)} records, both CRCs ok, {len(scalars)} scalars match in {path}")


if __name__ == "__main__":
    main()
