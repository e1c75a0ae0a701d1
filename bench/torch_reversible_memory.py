#!/usr/bin/python3
"""Memory benchmark of the ReversibleTrainer, next to PyTorch, in one run.

Trains ReformerLM (d_model 256, 4 heads, sequence 512, batch 8, d_ff 1024,
vocabulary 256, dropout 0.1, Adam) at depths 4, 16 and 64 with ctrax's
standard Trainer and its ReversibleTrainer (build/bench_reversible_memory),
and PyTorch (Debian's python3-torch) training the same model without
reversible layers (a pre-LayerNorm TransformerLM of the same sizes) plainly
and with torch.utils.checkpoint around each block. Every configuration runs
in its own process, so peak RSS is its own. Prints the measurements and one
table of ratios.

    /usr/bin/python3 bench/torch_reversible_memory.py [--steps 5,3,2] [--depths 4,16,64]
        [--ctrax-bin build/bench_reversible_memory] [--threads 2]
        [--budget-gib G]

Runs predicted to need more memory than --budget-gib (default: 60% of
MemAvailable; ctrax's standard trainer is predicted at twice its linearly
extrapolated steady peak, since its first step chains arena blocks, and
PyTorch at 1.25 times) are not started: ctrax's standard trainer runs instead under a
device byte limit of --fail-limit-gib (4) and reports the CT_ERR_MEMORY it
gets; the plain PyTorch run is reported as skipped with its predicted need.
Predictions are linear fits over the depths already measured.

The two ctrax trainers' step times are also compared in one process that
alternates their steps (bench_reversible_memory --trainer both), so that
both see the same load: that median ratio is the one to read.

Step time is measured over steps 2..S (step 1 sizes ctrax's arena and warms
PyTorch's allocator): wall clock and process CPU time, mean and least. On a
shared machine other processes slow a run down by varying amounts, so the
ratios use the least CPU time of a step (--steps gives the steps per depth).
Peaks are over steps 2..S too (VmHWM reset through
/proc/self/clear_refs after step 1; ctrax's device peak reset likewise).
"""

import argparse
import json
import math
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MIB = 1024.0 * 1024.0


# ---- the PyTorch side (runs in a child process) -------------------------------


def rss_bytes():
    now = peak = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return now, peak


def reset_peak_rss():
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def torch_worker(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    d, dff, h, T, B, V, p = a.d_model, a.d_ff, a.heads, a.seq, a.batch, a.vocab, 0.1

    class Block(nn.Module):
        """x + Attention(LayerNorm(x)), then x + FeedForward(LayerNorm(x)): the
        two half-residuals of a Reformer block without the reversible split."""

        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(d, eps=1e-6)
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.ln2 = nn.LayerNorm(d, eps=1e-6)
            self.ff1, self.ff2 = nn.Linear(d, dff), nn.Linear(dff, d)
            self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

        def forward(self, x):
            y = self.ln1(x)

            def heads(t):
                return t.view(B, T, h, d // h).transpose(1, 2)

            q, k, v = heads(self.q(y)), heads(self.k(y)), heads(self.v(y))
            s = (q @ k.transpose(-1, -2)) / math.sqrt(d // h)
            s = s.masked_fill(self.mask, float("-inf"))
            att = F.dropout(torch.softmax(s, dim=-1), p, self.training)
            y = (att @ v).transpose(1, 2).reshape(B, T, d)
            x = x + self.o(y)
            y = self.ff1(self.ln2(x))
            y = F.gelu(F.dropout(y, p, self.training), approximate="tanh")
            return x + F.dropout(self.ff2(y), p, self.training)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, d)
            pos = torch.arange(T, dtype=torch.float32)[:, None]
            div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
            pe = torch.zeros(T, d)
            pe[:, 0::2] = torch.sin(pos * div)
            pe[:, 1::2] = torch.cos(pos * div)
            self.register_buffer("pe", pe)
            self.blocks = nn.ModuleList(Block() for _ in range(a.depth))
            self.ln = nn.LayerNorm(d, eps=1e-6)
            self.out = nn.Linear(d, V)

        def forward(self, tokens):
            x = F.dropout(self.emb(F.pad(tokens, (1, 0))[:, :-1]), p, self.training) + self.pe
            for blk in self.blocks:
                if a.mode == "checkpoint":
                    x = checkpoint(blk, x, use_reentrant=False)
                else:
                    x = blk(x)
            return self.out(F.dropout(self.ln(x), p, self.training))

    model = LM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-5)
    n_weights = sum(t.numel() for t in model.parameters())
    tokens = torch.randint(0, V, (B, T))
    rss_init, _ = rss_bytes()
    times, cpu, loss = [], [], 0.0
    for step in range(1, int(a.steps) + 1):
        if step == 2:
            reset_peak_rss()
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        loss_t = F.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1))
        loss_t.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        loss = float(loss_t)
        print(f"  torch {a.mode} depth {a.depth} step {step}: {times[-1]:.2f} s (cpu {cpu[-1]:.2f} s), "
              f"loss {loss:.4f}",
              file=sys.stderr, flush=True)
    _, peak = rss_bytes()
    print(json.dumps({"impl": "torch", "trainer": a.mode, "depth": a.depth, "steps": int(a.steps),
                      "n_weights": n_weights, "rss_after_init": rss_init, "peak_rss": peak,
                      "step1_s": times[0], "step_s": sum(times[1:]) / (len(times) - 1),
                      "step_cpu_s": sum(cpu[1:]) / (len(cpu) - 1), "step_cpu_min_s": min(cpu[1:]),
                      "loss": loss}))


# ---- the driver -----------------------------------------------------------------------


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def run_json(cmd, env):
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, env=env, text=True)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    if not lines:
        return {"error": f"exit code {p.returncode}, no result"}
    return json.loads(lines[-1])


def predict(results, key, depth):
    """Linear fit of results[key] over depth (None with fewer than 2 points)."""
    pts = [(r["depth"], r[key]) for r in results if key in r and "error" not in r]
    if len(pts) < 2:
        return None
    (d0, v0), (d1, v1) = pts[0], pts[-1]
    if d1 == d0:
        return None
    return v0 + (v1 - v0) * (depth - d0) / (d1 - d0)


def fmt_mib(b):
    return "-" if b is None else f"{b / MIB:,.0f}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", choices=["torch"], help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="plain", choices=["plain", "checkpoint"])
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--depths", default="4,16,64")
    ap.add_argument("--steps", default="5,3,2", help="steps per run, one per depth (or one for all)")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--d-ff", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-gib", type=float, default=0.0)
    ap.add_argument("--fail-limit-gib", type=float, default=4.0)
    ap.add_argument("--ctrax-bin", default=os.path.join(ROOT, "build", "bench_reversible_memory"))
    a = ap.parse_args()
    if a.worker == "torch":
        torch_worker(a)
        return
    if not os.path.exists(a.ctrax_bin):
        sys.exit(f"{a.ctrax_bin} not found: build it with `cmake --build build` first")

    budget = a.budget_gib * (1 << 30) if a.budget_gib > 0 else 0.6 * mem_available()
    # Passive OpenMP waiting keeps CPU time a measure of work on a shared machine.
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OMP_WAIT_POLICY="passive")
    sizes = ["--batch", str(a.batch), "--seq", str(a.seq), "--d-model", str(a.d_model), "--d-ff",
             str(a.d_ff), "--heads", str(a.heads), "--vocab", str(a.vocab)]
    depths = [int(x) for x in a.depths.split(",")]
    if a.worker is None:
        steps_of = [int(x) for x in a.steps.split(",")]
        steps_of = (steps_of * len(depths))[:len(depths)] if len(steps_of) == 1 else steps_of
        if len(steps_of) != len(depths) or min(steps_of) < 2:
            sys.exit("--steps: give one count >= 2, or one per depth")
    runs = {"standard": [], "reversible": [], "plain": [], "checkpoint": [], "both": []}
    started = time.time()
    for depth, steps in zip(depths, steps_of):
        common = ["--depth", str(depth), "--steps", str(steps)] + sizes
        for trainer in ("reversible", "standard"):
            cmd = [a.ctrax_bin, "--trainer", trainer] + common
            # Step 1 grows ctrax's arena by chaining blocks that double in
            # size, so it may need up to twice the steady peak (linear in depth).
            steady = predict(runs[trainer], "peak_device", depth)
            need = None if steady is None else 2 * steady
            if trainer == "standard" and need is not None and need > budget:
                # Show that it does not fit rather than filling this machine.
                cmd += ["--limit-gib", f"{min(a.fail_limit_gib, budget / (1 << 30)):.2f}"]
            r = run_json(cmd, env)
            if need is not None:
                r["predicted_need"] = need
            runs[trainer].append(r)
        # Step time of the two ctrax trainers, measured fairly: both in one
        # process, steps alternating, where the standard trainer fits.
        if "error" not in runs["standard"][-1]:
            cmd = [a.ctrax_bin, "--trainer", "both", "--depth", str(depth), "--steps", str(max(steps, 4))] + sizes
            runs["both"].append(run_json(cmd, env) | {"depth": depth})
        for mode in ("checkpoint", "plain"):
            need = predict(runs[mode], "peak_rss", depth)
            need = None if need is None else 1.25 * need  # the allocator's slack
            if need is not None and need > budget:
                runs[mode].append({"depth": depth, "skipped": True, "predicted_peak_rss": need})
                print(f"  torch {mode} depth {depth}: skipped, predicted peak RSS {need / MIB:,.0f} MiB "
                      f"> budget {budget / MIB:,.0f} MiB", file=sys.stderr)
                continue
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", "torch", "--mode", mode,
                   "--threads", str(a.threads)] + common
            runs[mode].append(run_json(cmd, env))

    print(f"\nReformerLM d_model {a.d_model}, {a.heads} heads, d_ff {a.d_ff}, vocab {a.vocab}, "
          f"batch {a.batch} x seq {a.seq}, Adam; steps per run {a.steps} at depths {a.depths}, "
          f"{a.threads} threads; "
          f"load average {os.getloadavg()[0]:.1f}; {time.time() - started:.0f} s in all")
    print("Peaks and step times over steps 2..S: wall clock (mean), CPU time (mean, least). The machine "
          "may be shared, so ratios use the least CPU time. MiB = 2^20 bytes. 'device' = ctrax's counted "
          "device bytes (CPU here); torch has no counter.\n")
    hdr = f"{'depth':>5} {'run':<24} {'weights':>10} {'device peak':>12} {'RSS peak':>10} " \
          f"{'RSS init':>9} {'step s':>8} {'cpu s':>8} {'cpu min':>8}  note"
    print(hdr)
    print("-" * len(hdr))
    names = {"standard": "ctrax standard Trainer", "reversible": "ctrax ReversibleTrainer",
             "plain": "torch plain", "checkpoint": "torch checkpoint"}
    for i, depth in enumerate(depths):
        for key in ("standard", "reversible", "plain", "checkpoint"):
            r = runs[key][i]
            note = ""
            if r.get("skipped"):
                note = f"not run: predicted peak RSS {r['predicted_peak_rss'] / MIB:,.0f} MiB > budget " \
                       f"{budget / MIB:,.0f} MiB"
                print(f"{depth:>5} {names[key]:<24} {'':>10} {'':>12} {'':>10} {'':>9} {'':>8} {'':>8} {'':>8}  {note}")
                continue
            if "error" in r:
                pred = r.get("predicted_need")
                note = r["error"] + (f" (predicted need {pred / MIB:,.0f} MiB)" if pred else "")
                print(f"{depth:>5} {names[key]:<24} {'':>10} {'':>12} {'':>10} {'':>9} {'':>8} {'':>8} {'':>8}  {note}")
                continue
            dev = fmt_mib(r.get("peak_device")) if r["impl"] == "ctrax" else "-"
            print(f"{depth:>5} {names[key]:<24} {r['n_weights']:>10,} {dev:>12} {fmt_mib(r['peak_rss']):>10} "
                  f"{fmt_mib(r['rss_after_init']):>9} {r['step_s']:>8.2f} {r['step_cpu_s']:>8.2f} "
                  f"{r['step_cpu_min_s']:>8.2f}")

    # Ratios.
    def get(key, depth, field):
        for r in runs[key]:
            if r.get("depth") == depth and field in r and "error" not in r:
                return r[field]
        return None

    print("\nRatios")
    d0, d1 = depths[0], depths[-1]
    rows = []
    for depth in depths:
        rd, sd = get("reversible", depth, "peak_device"), get("standard", depth, "peak_device")
        rt, stt = get("reversible", depth, "step_cpu_min_s"), get("standard", depth, "step_cpu_min_s")
        rw, sw = get("reversible", depth, "step_cpu_s"), get("standard", depth, "step_cpu_s")
        rows.append((f"depth {depth}: reversible / standard device peak",
                     f"{rd / sd:.3f}" if rd and sd else "standard did not fit"))
        both = get("both", depth, "median_ratio")
        rows.append((f"depth {depth}: reversible / standard step cpu time, alternating steps (target <= 1.4)",
                     f"{both:.2f} (median of {get('both', depth, 'ratios')})" if both else "-"))
        rows.append((f"depth {depth}: reversible / standard step cpu time, separate runs, least (mean)",
                     f"{rt / stt:.2f} ({rw / sw:.2f})" if rt and stt else "-"))
        pp, pc = get("plain", depth, "peak_rss"), get("checkpoint", depth, "peak_rss")
        tp, tc = get("plain", depth, "step_cpu_min_s"), get("checkpoint", depth, "step_cpu_min_s")
        rows.append((f"depth {depth}: torch checkpoint / plain peak RSS", f"{pc / pp:.3f}" if pc and pp else "-"))
        rows.append((f"depth {depth}: torch checkpoint / plain step cpu time, least",
                     f"{tc / tp:.2f}" if tc and tp else "-"))
        rr = get("reversible", depth, "peak_rss")
        rows.append((f"depth {depth}: ctrax reversible / torch checkpoint peak RSS",
                     f"{rr / pc:.3f}" if rr and pc else "-"))
        rows.append((f"depth {depth}: ctrax reversible / torch checkpoint step cpu time, least",
                     f"{rt / tc:.2f}" if rt and tc else "-"))
    p0, p1 = get("reversible", d0, "peak_device"), get("reversible", d1, "peak_device")
    if p0 and p1 and d1 != d0:  # growth needs two depths
        rows.append((f"reversible device peak growth, depth {d0} -> {d1} (target < 5%)", f"{100 * (p1 / p0 - 1):+.2f}%"))
    r0, r1 = get("reversible", d0, "peak_rss"), get("reversible", d1, "peak_rss")
    h0, h1 = get("reversible", d0, "host_slab_bytes"), get("reversible", d1, "host_slab_bytes")
    if r0 and r1 and h0 and h1 and h1 != h0:
        rows.append((f"reversible peak RSS growth / added weights+slots, depth {d0} -> {d1} (target <= 1)",
                     f"{(r1 - r0) / (h1 - h0):.3f}  ({(r1 - r0) / MIB:,.0f} MiB vs {(h1 - h0) / MIB:,.0f} MiB)"))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print("\nJSON:", json.dumps(runs))


if __name__ == "__main__":
    main()
