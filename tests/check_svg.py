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

A long curve is drawn reduced, through at most 4 points a pixel column (the
first, lowest, highest and last value of the steps it covers): its
data-points still count the file's finite values, its points are fewer, at
most 4 times the plot frame's width, x never decreasing, and its first and
last values and its extremes are among them, where the panel's scale puts
them. Its marks of values that are not finite may stand for several each
("steps A to B: N values not finite").
"""
import re
import json
import math
import sys
import xml.etree.ElementTree as ET

NS = "{http://www.w3.org/2000/svg}"


def fail(msg):
    print(f"check_svg: FAIL: {msg}")
    sys.exit(1)


def expected_series(jsonl, finite_only=True):
    """{(metric, mode): [(step, value)]}: finite values (all with finite_only
    False, None for null), the last per step, by step."""
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
        out[key] = [(s, v) for s, v in sorted(by_step.items())
                    if not finite_only or (v is not None and math.isfinite(v))]
    return out


def line_groups(panel, line):
    """The <g> elements of panel that follow line up to the next polyline:
    that curve's markers and marks."""
    out, seen = [], False
    for child in panel:
        if child is line:
            seen = True
        elif seen and child.tag == NS + "polyline":
            break
        elif seen and child.tag == NS + "g":
            out.append(child)
    return out


def legend_texts(panel):
    return ["".join(t.itertext()) for g in panel.iter(NS + "g") if g.get("class") == "legend"
            for t in g.iter(NS + "text")]


def check_legend_inside(metric, panel):
    """Every legend entry (its line, and its text at ctrax plot's 7 px a
    character) and "+N more" lies inside the panel's box."""
    box = [r for r in panel.iter(NS + "rect") if r.get("fill") == "#fafafa"]
    if len(box) != 1:
        fail(f"{metric}: {len(box)} panel boxes")
    bx, by = float(box[0].get("x")), float(box[0].get("y"))
    bw, bh = float(box[0].get("width")), float(box[0].get("height"))
    for g in panel.iter(NS + "g"):
        if g.get("class") not in ("legend", "legend-more"):
            continue
        for t in g.iter(NS + "text"):
            x, y, n = float(t.get("x")), float(t.get("y")), len("".join(t.itertext()))
            x0, x1 = (x - 7 * n, x) if t.get("text-anchor") == "end" else (x, x + 7 * n)
            if not (bx - 0.15 <= x0 and x1 <= bx + bw + 0.15 and by <= y <= by + bh):
                fail(f"{metric}: legend text '{''.join(t.itertext())}' at ({x0:.1f}..{x1:.1f}, {y}) is outside "
                     f"the panel ({bx}..{bx + bw}, {by}..{by + bh})")
        for ln in g.iter(NS + "line"):
            if not (bx - 0.15 <= float(ln.get("x1")) and float(ln.get("x2")) <= bx + bw + 0.15):
                fail(f"{metric}: a legend line at x {ln.get('x1')} is outside the panel ({bx}..{bx + bw})")


def add_points(scale, want, pts):
    for (step, value), (x, y) in zip(want, pts):
        scale["x"].append((float(step), x))
        scale["y"].append((float(value), y))


def affine(pairs):
    """(a, b) with page = a + b * data / 2 through the pairs' extremes, or
    None (halves: values near the limits of a double keep finite differences)."""
    lo, hi = min(pairs), max(pairs)
    lo, hi = (lo[0] / 2, lo[1]), (hi[0] / 2, hi[1])
    if hi[0] == lo[0]:
        return None
    b = (hi[1] - lo[1]) / (hi[0] - lo[0])
    return lo[1] - b * lo[0], b


def mark_count(metric, path):
    """How many values a mark of values not finite stands for, by its title."""
    title = "".join(t.text or "" for t in path.iter(NS + "title"))
    m = re.fullmatch(r"step -?\d+: not finite|steps (-?\d+) to (-?\d+): (\d+) values not finite", title)
    if not m:
        fail(f"{metric}: a mark titled {title!r}")
    return int(m.group(3)) if m.group(3) else 1


def check_reduced(metric, mode, panel, want, pts, scale):
    """A curve drawn through fewer points than it has values: at most 4 a
    pixel column, x never decreasing; its ends and extremes are drawn, and
    go to check_scale with the other curves' points."""
    frame = [r for r in panel.iter(NS + "rect") if r.get("fill") == "none"]
    width = float(frame[0].get("width"))
    if len(pts) > 4 * width:
        fail(f"{metric} {mode}: {len(pts)} points for a plot {width} wide (at most 4 a pixel column)")
    for i in range(1, len(pts)):
        if pts[i][0] < pts[i - 1][0]:
            fail(f"{metric} {mode}: x decreases at point {i}")
    lo = min(want, key=lambda p: p[1])
    hi = max(want, key=lambda p: p[1])
    low_y = max(pts, key=lambda p: p[1])  # the page's y grows downwards
    high_y = min(pts, key=lambda p: p[1])
    for (step, value), (x, y) in ((want[0], pts[0]), (want[-1], pts[-1])):
        scale["x"].append((float(step), x))
        scale["y"].append((float(value), y))
    # The extremes by height only: a value may be reached at several steps.
    scale["y"] += [(float(lo[1]), low_y[1]), (float(hi[1]), high_y[1])]


def check_scale(metric, panel, scale):
    """Every point lies on one affine map per axis (x rising with the step, y
    falling as the value rises), inside the plot frame, and each tick label
    sits where its value maps to, at even steps of 1, 2 or 5 times a power of
    ten (the SVG's numbers have one decimal: 0.15 of slack)."""
    frame = [r for r in panel.iter(NS + "rect") if r.get("fill") == "none"]
    if len(frame) != 1:
        fail(f"{metric}: {len(frame)} plot frames")
    fx, fy = float(frame[0].get("x")), float(frame[0].get("y"))
    fw, fh = float(frame[0].get("width")), float(frame[0].get("height"))
    for axis, cls, lo, hi, sign in (("x", "x-ticks", fx, fx + fw, 1), ("y", "y-ticks", fy, fy + fh, -1)):
        pairs = scale[axis]
        for _, page in pairs:
            if not lo - 0.15 <= page <= hi + 0.15:
                fail(f"{metric}: a point at {axis} {page} is outside the frame [{lo}, {hi}]")
        fit = affine(pairs)
        if fit is None:
            continue
        a, b = fit
        if not b * sign > 0:
            fail(f"{metric}: {axis} goes the wrong way with the data (slope {b})")
        # The steps span the frame's width; the values its height less a
        # margin of 5% of their range at each end (1/22 of the height).
        (d_lo, p_lo), (d_hi, p_hi) = min(pairs), max(pairs)
        want_lo, want_hi = (lo, hi) if axis == "x" else (hi - fh / 22, lo + fh / 22)
        margin = (d_hi / 2 - d_lo / 2) * 0.1  # past a double's range the margin is cut short
        clipped = axis == "y" and not (math.isfinite(d_lo - margin) and math.isfinite(d_hi + margin))
        if not clipped and (abs(p_lo - want_lo) > 0.15 or abs(p_hi - want_hi) > 0.15):
            fail(f"{metric}: {axis} of the data's ends {d_lo}, {d_hi} at {p_lo}, {p_hi}, expected {want_lo:.2f}, "
                 f"{want_hi:.2f}")
        for data, page in pairs:
            if abs(a + b * data / 2 - page) > 0.15:
                fail(f"{metric}: {axis} of {data} is {page}, the line through the ends puts it at {a + b * data / 2:.2f}")
        ticks = [(float(t.text), float(t.get(axis))) for g in panel.iter(NS + "g") if g.get("class") == cls
                 for t in g.iter(NS + "text")]
        if len(ticks) < 2 and clipped and len(ticks) == 1:
            continue  # a range past a double's: one tick (nice_ticks' fallback)
        if len(ticks) < 2:
            fail(f"{metric}: {len(ticks)} {cls}")
        values = [v for v, _ in ticks]
        step = values[1] - values[0]
        mant = step / 10 ** math.floor(math.log10(step)) if step > 0 else 0
        if not any(abs(mant - m) < 1e-6 for m in (1, 2, 5)):
            fail(f"{metric}: {cls} step {step} is not 1, 2 or 5 times a power of ten")
        # Labels as written by hand: a zero is "0" (no "-0", no 1e-17), and a
        # step below 1 has as many decimals as it needs, no more.
        texts = [t.text for g in panel.iter(NS + "g") if g.get("class") == cls for t in g.iter(NS + "text")]
        if axis == "x" and step < 1:
            fail(f"{metric}: x-ticks {values} are not whole steps")
        decimals = 0 if step >= 1 else math.ceil(-math.log10(step) - 1e-9)
        for text, v in zip(texts, values):
            if abs(v) < abs(step) * 1e-6 and text != "0" + ("." + "0" * decimals if decimals else ""):
                fail(f"{metric}: {cls} zero written {text!r}")
            if "e" not in text and len(text.partition(".")[2]) != decimals:
                fail(f"{metric}: {cls} label {text!r} for a step of {step} has not {decimals} decimals")
        for i, (v, page) in enumerate(ticks):
            page -= 4 if axis == "y" else 0  # a y label's baseline is 4 below its line
            if abs(v - (values[0] + i * step)) > 1e-6 * max(1, abs(step) * 1e3):
                fail(f"{metric}: {cls} {values} are not evenly spaced")
            if not lo - 0.15 <= page <= hi + 0.15 or abs(a + b * v / 2 - page) > 0.15 + abs(b) * abs(step) * 1e-3:
                fail(f"{metric}: tick {v} at {axis} {page}, its value maps to {a + b * v / 2:.2f} in [{lo}, {hi}]")


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
    every = expected_series(jsonl, finite_only=False)
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
        scale = {"x": [], "y": []}  # (data, page) pairs of every curve of the panel
        modes = sorted(mode for (m, mode) in expected if m == metric)
        more = ["".join(t.itertext()) for g in panel.iter(NS + "g") if g.get("class") == "legend-more"
                for t in g.iter(NS + "text")]
        shown = 0
        if sorted(lines) != modes:
            fail(f"panel {metric!r} has curves for modes {sorted(lines)}, expected {modes}")
        for mode in modes:
            want = expected[(metric, mode)]
            line = lines[mode]
            pts = [tuple(float(c) for c in p.split(",")) for p in line.get("points").split()]
            reduced = len(pts) < len(want)
            if int(line.get("data-points")) != len(want) or not (reduced or len(pts) == len(want)):
                fail(f"{metric} {mode}: {len(pts)} points (data-points {line.get('data-points')}), "
                     f"expected {len(want)}")
            for (x, y) in pts:
                if not (vb[0] <= x <= vb[0] + vb[2] and vb[1] <= y <= vb[1] + vb[3]):
                    fail(f"{metric} {mode}: point ({x}, {y}) outside the viewBox")
            if reduced:
                check_reduced(metric, mode, panel, want, pts, scale)
                print(f"check_svg: {metric} {mode}: {len(want)} values drawn as {len(pts)} points, extremes in place")
            for i in range(1, 0 if reduced else len(pts)):
                if not pts[i][0] > pts[i - 1][0]:
                    fail(f"{metric} {mode}: x does not increase at point {i}")
                dv, dy = want[i][1] - want[i - 1][1], pts[i][1] - pts[i - 1][1]
                if dv > 1e-12 * max(1.0, abs(want[i][1])) and not dy < 0.05:
                    fail(f"{metric} {mode}: value rises at step {want[i][0]} but y does not fall")
                if dv < -1e-12 * max(1.0, abs(want[i][1])) and not dy > -0.05:
                    fail(f"{metric} {mode}: value falls at step {want[i][0]} but y does not rise")
            if not reduced:
                print(f"check_svg: {metric} {mode}: {len(pts)} points, in order")
            n_curves += 1
            # One mark per value that is not finite, and the legend counts every step.
            marks = [p for g in panel.iter(NS + "g") if g.get("class") == "nonfinite"
                     for p in g.iter(NS + "path") if g in line_groups(panel, line)]
            n_bad = len(every[(metric, mode)]) - len(want)
            if sum(mark_count(metric, p) for p in marks) != n_bad or (marks and not reduced and len(marks) != n_bad):
                fail(f"{metric} {mode}: {len(marks)} marks of values not finite, expected {n_bad}")
            label = f"{mode} ({len(every[(metric, mode)])})"
            if label in legend_texts(panel):
                shown += 1
            elif any(t.endswith("...") and label.startswith(t[:-3]) for t in legend_texts(panel)):
                shown += 1  # a long name, cut to the panel's width
            elif not more:
                fail(f"{metric}: no legend '{label}' in {legend_texts(panel)}")
            # Dots on the curve's points when there are at most 60.
            dots = [c for g in line_groups(panel, line) if g.get("class") == "markers" for c in g.iter(NS + "circle")]
            if len(dots) != (len(want) if len(want) <= 60 else 0):
                fail(f"{metric} {mode}: {len(dots)} dots for {len(want)} points")
            if not reduced:
                add_points(scale, want, pts)
        if more and int(more[0][1:].split()[0]) != len(modes) - shown:
            fail(f"{metric}: legend says '{more[0]}' but {len(modes) - shown} of {len(modes)} modes have no label")
        check_legend_inside(metric, panel)
        check_scale(metric, panel, scale)
    print(f"check_svg: {svg_path}: well-formed SVG, {len(panels)} panel(s), {n_curves} curve(s) as in {jsonl}")


main()
