#!/usr/bin/python3
"""Checks an SVG of `ctrax plot` against the metrics.jsonl it was drawn from.

    /usr/bin/python3 tests/check_svg.py OUT.svg METRICS.jsonl METRIC[,METRIC...]

The SVG must parse as XML (xml.etree), have an <svg> root in the SVG
namespace with a viewBox, a title, and one panel per METRIC. In each panel
there must be one <polyline> per mode the metric has in metrics.jsonl, whose
points are the metric's finite values (a step written twice counts once: the
last value) in step order: the count of x,y pairs, their order (x increasing)
and the relative heights (y decreasing where the value increases) are
compared with the file. Every point must lie inside the viewBox. Exits 0 when
all holds and prints what it checked.
"""
import json
import math
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print(f"check_svg: FAIL: {msg}")
    sys.exit(1)


def expected_series(jsonl):
    """{(metric, mode): [(step, value)]}: finite values, the last per step, by step."""
    series = {}
    with open(jsonl, encoding="utf-8") as f:
        for line in f:
            try:
                o = json.loads(line)
                key = (o["metric"], o["mode"])
                step, value = int(o["step"]), o["value"]
            except (ValueError, KeyError, TypeError):
                continue  # what ctrax plot skips too (a line cut short)
            series.setdefault(key, {})[step] = value  # later lines replace earlier ones
    out = {}
    for key, by_step in series.items():
        out[key] = [(s, v) for s, v in sorted(by_step.items()) if v is not None and math.isfinite(v)]
    return out


def main():
    if len(sys.argv) != 4:
        fail("usage: check_svg.py OUT.svg METRICS.jsonl METRIC[,METRIC...]")
    svg_path, jsonl, metrics = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
    try:
        root = ET.parse(svg_path).getroot()
    except ET.ParseError as e:
        fail(f"{svg_path} is not well-formed XML: {e}")
    if root.tag != NS + "svg":
        fail(f"root element is {root.tag}, not svg in the SVG namespace")
    vb = [float(x) for x in root.get("viewBox", "").split()]
    if len(vb) != 4 or vb[2] <= 0 or vb[3] <= 0:
        fail(f"bad viewBox {root.get('viewBox')!r}")
    if root.find(NS + "title") is None or not root.find(NS + "title").text:
        fail("no <title>")
    expected = expected_series(jsonl)
    panels = {g.get("data-metric"): g for g in root.iter(NS + "g") if g.get("class") == "panel"}
    if sorted(panels) != sorted(metrics):
        fail(f"panels {sorted(panels)}, expected {sorted(metrics)}")
    n_curves = 0
    for metric in metrics:
        panel = panels[metric]
        titles = [t.text for t in panel.iter(NS + "text") if t.get("class") == "panel-title"]
        if titles != [metric]:
            fail(f"panel {metric!r} has the title(s) {titles}")
        lines = {p.get("data-mode"): p for p in panel.iter(NS + "polyline")}
        modes = sorted(mode for (m, mode) in expected if m == metric)
        if sorted(lines) != modes:
            fail(f"panel {metric!r} has curves for modes {sorted(lines)}, expected {modes}")
        for mode in modes:
            want = expected[(metric, mode)]
            line = lines[mode]
            pts = [tuple(float(c) for c in p.split(",")) for p in line.get("points").split()]
            if len(pts) != len(want) or int(line.get("data-points")) != len(want):
                fail(f"{metric} {mode}: {len(pts)} points (data-points {line.get('data-points')}), "
                     f"expected {len(want)}")
            for (x, y) in pts:
                if not (vb[0] <= x <= vb[0] + vb[2] and vb[1] <= y <= vb[1] + vb[3]):
                    fail(f"{metric} {mode}: point ({x}, {y}) outside the viewBox")
            for i in range(1, len(pts)):
                if not pts[i][0] > pts[i - 1][0]:
                    fail(f"{metric} {mode}: x does not increase at point {i}")
                dv, dy = want[i][1] - want[i - 1][1], pts[i][1] - pts[i - 1][1]
                if dv > 1e-12 * max(1.0, abs(want[i][1])) and not dy < 0.05:
                    fail(f"{metric} {mode}: value rises at step {want[i][0]} but y does not fall")
                if dv < -1e-12 * max(1.0, abs(want[i][1])) and not dy > -0.05:
                    fail(f"{metric} {mode}: value falls at step {want[i][0]} but y does not rise")
            print(f"check_svg: {metric} {mode}: {len(pts)} points, in order")
            n_curves += 1
    print(f"check_svg: {svg_path}: well-formed SVG, {len(panels)} panel(s), {n_curves} curve(s) as in {jsonl}")


main()
