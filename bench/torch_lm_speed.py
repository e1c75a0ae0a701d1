#!/usr/bin/python3
"""PyTorch side of bench/lm_speed (issue 13, item 4), and the table of both sides.

Trains, in PyTorch (Debian's python3-torch, CPU), the model build/bench_lm_speed
trains in ctrax -- ctrax's TransformerLM (include/ctrax/models/models.h):
  ShiftRight(1), Embedding(256, d), PositionalEncoding (a trainable table
  started at the sinusoids, as Trax's),
  n_layers x [x + CausalAttention(LayerNorm(x)), x + FF(LayerNorm(x))],
  LayerNorm, Dense(256)
with CausalAttention = Dense q, k, v (with biases), scaled dot products under
the causal mask, softmax, weighted sum of values, Dense out (the core as torch
1.13's own nn.MultiheadAttention computes it: q scaled first, the mask added
inside the product by baddbmm); FF = Dense(d_ff),
Relu, Dense(d_model); LayerNorm eps 1e-6; dropout 0 (no dropout layers at all,
as ctrax's Dropout(0) does no work either), vocabulary 256 (bytes), a fixed
batch of random bytes, cross-entropy averaged over every position, and Adam
as ctrax's: lr 1e-4, b1 0.9, b2 0.999, eps 1e-5 added to sqrt(v^), bias
correction, weight decay w *= (1 - 1e-5) -- torch.optim.AdamW with
weight_decay = 1e-5 / lr does exactly that.

    /usr/bin/python3 bench/torch_lm_speed.py --config A --threads N [--steps 20]
                                              # one run: one JSON line
    /usr/bin/python3 bench/torch_lm_speed.py --table results.jsonl
                                              # the table of both sides

bench/lm_speed.sh runs both sides and calls --table. The thread count:
torch.set_num_threads(N), with OMP_NUM_THREADS=N set by the script. The BLAS:
this torch does its float matrix products in the system OpenBLAS (its
libtorch_cpu links libblas.so.3 -> openblas-openmp; BLAS_INFO=generic, no MKL),
so OPENBLAS_CORETYPE, exported by the script, gives it the same kernel as
ctrax; the JSON line names the kernel OpenBLAS reports in this process
(openblas_get_corename). Step 1 is warm-up; steps 2..S are timed one by one.
Peak RSS is VmHWM of the process (the interpreter and torch's libraries
included: what a user of either side pays).

Model FLOPs per token (the same formula as bench/lm_speed.c):
  6 * P_dense + 6 * n_layers * T * d_model,
  P_dense = n_layers * (4 d_model^2 + 2 d_model d_ff) + d_model * vocab.
MFU = tokens/s * FLOPs per token / the sgemm rate of the model's dense shapes
measured in the same run (bench_lm_speed --sgemm, median over its repeats) at
the same thread count. "MFU by CPU" divides the same way in process CPU time
(tokens per CPU-second, sgemm FLOPs per CPU-second): on a machine shared with
other jobs, wall-clock rates measured a few seconds apart see different loads,
CPU-time rates much less so. The table also prints the cores' vector FMA peak
(measured after each sgemm run) and the ratio ceiling at the sgemm rate: the
sgemm rate over PyTorch's model FLOP rate, the ratio ctrax would reach with
every model FLOP at the GEMM's own rate.
"""

import argparse
import ctypes
import json
import math
import statistics
import sys
import time

MIB = 1024.0 * 1024.0
VOCAB = 256
CONFIGS = {
    # d_model, layers, heads, d_ff, T, batch (issue 13)
    "A": (256, 4, 4, 1024, 128, 16),
    "B": (512, 6, 8, 2048, 256, 8),
    "C": (256, 2, 4, 1024, 2048, 2),
}
# Issue 13's targets for ctrax against PyTorch.
TARGET_RATIO = {"A": 1.5, "B": 1.2}
TARGET_MFU = {"B": 0.75}
TARGET_RSS = {"A": 0.5, "B": 0.5}


def flops_per_token(d, layers, d_ff, seq):
    p_dense = layers * (4 * d * d + 2 * d * d_ff) + d * VOCAB
    return 6 * p_dense + 6 * layers * seq * d


def peak_rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def wait_env():
    """How OpenMP's idle threads wait in this process, as the environment set
    it (the same string as bench/lm_speed.c's)."""
    import os
    return " ".join(f"{k}={os.environ.get(k, '-')}" for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"))


def blas_core():
    """The OpenBLAS kernel of the OpenBLAS torch loaded (the same library
    object: dlopen returns the already loaded one)."""
    try:
        lib = ctypes.CDLL("libopenblas.so.0")
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (OSError, AttributeError):
        return "unknown"


# ---- one run, in this process ------------------------------------------------------


def worker(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    d, layers, heads, d_ff, T, B = CONFIGS[a.config]

    class CausalAttention(nn.Module):
        # The attention core as PyTorch 1.13's own nn.MultiheadAttention
        # computes it (F.multi_head_attention_forward): q scaled before the
        # product (B x T x d work, not B x H x T x T), the causal mask an
        # additive float (T, T) of 0 and -inf folded into the product by
        # baddbmm, softmax, bmm with v. Two T x T tensors a layer forward
        # (scores, probabilities); the previous (q k^T) / sqrt(dh) then
        # masked_fill made four, and two more T x T passes in backward.
        # q, k, v stay three Linears (ctrax's three Denses, the shapes the
        # sgemm rate is measured on), not MultiheadAttention's fused in_proj.
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
            self.register_buffer("mask", torch.zeros(T, T).masked_fill_(
                torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")))

        def forward(self, x):  # (B, T, d)
            dh = d // heads

            def split(t):  # (B, T, d) -> (B * H, T, dh)
                return t.view(B, T, heads, dh).transpose(1, 2).reshape(B * heads, T, dh)

            q, k, v = split(self.q(x) / math.sqrt(dh)), split(self.k(x)), split(self.v(x))
            att = torch.softmax(torch.baddbmm(self.mask, q, k.transpose(-1, -2)), dim=-1)  # (B * H, T, T)
            return self.o(torch.bmm(att, v).view(B, heads, T, dh).transpose(1, 2).reshape(B, T, d))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
            self.att = CausalAttention()
            self.ff1, self.ff2 = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

        def forward(self, x):
            x = x + self.att(self.ln1(x))
            return x + self.ff2(F.relu(self.ff1(self.ln2(x))))

    class TransformerLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(VOCAB, d)
            # Trax's PositionalEncoding (ctrax's default): a trainable
            # (max_len, d) table started at the sinusoids, sin on even
            # features, cos on odd -- a weight with its gradient and Adam
            # update, as on the ctrax side (T * d weights).
            pos = torch.arange(T, dtype=torch.float32)[:, None]
            div = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
            pe = torch.zeros(T, d)
            pe[:, 0::2], pe[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
            self.pe = nn.Parameter(pe)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(d, eps=1e-6)
            self.out = nn.Linear(d, VOCAB)

        def forward(self, tokens):  # (B, T) int64 -> (B, T, VOCAB)
            x = F.pad(tokens[:, :-1], (1, 0))  # ShiftRight(1)
            x = self.embed(x) + self.pe
            for blk in self.blocks:
                x = blk(x)
            return self.out(self.ln(x))

    model = TransformerLM()
    lr, decay = 1e-4, 1e-5
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-5, weight_decay=decay / lr)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (B, T), generator=g)

    wall, cpu, losses = [], [], []
    for step in range(1, a.steps + 1):
        w0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens).view(B * T, VOCAB), tokens.view(B * T))
        loss.backward()
        opt.step()
        losses.append(loss.item())
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    n_weights = sum(p.numel() for p in model.parameters())
    print(json.dumps({
        "impl": "torch", "config": a.config, "threads": a.threads, "blas_core": blas_core(), "wait": wait_env(),
        "torch_threads": torch.get_num_threads(), "d_model": d, "layers": layers, "heads": heads, "d_ff": d_ff,
        "seq": T, "batch": B, "n_weights": n_weights, "flops_per_token": flops_per_token(d, layers, d_ff, T),
        "steps": a.steps, "wall_s": [round(x, 4) for x in wall[1:]], "cpu_s": [round(x, 4) for x in cpu[1:]],
        "step1_s": round(wall[0], 3), "peak_rss": peak_rss(), "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4)}))


# ---- the table ---------------------------------------------------------------------


def spread(values, fmt="{:,.0f}"):
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return fmt.format(lo) if fmt.format(lo) == fmt.format(hi) else fmt.format(lo) + "-" + fmt.format(hi)


def table(path):
    runs = [json.loads(line) for line in open(path) if line.startswith("{")]
    configs = sorted({r["config"] for r in runs})
    verdicts = []
    for cfg in configs:
        rs = [r for r in runs if r["config"] == cfg]
        train = [r for r in rs if r["impl"] in ("ctrax", "torch")]
        if not train:
            continue
        r0 = train[0]
        tokens = r0["batch"] * r0["seq"]
        fpt = {r["flops_per_token"] for r in train}
        print(f"\nConfig {cfg}: d_model {r0['d_model']}, {r0['layers']} layers, {r0['heads']} heads, "
              f"d_ff {r0['d_ff']}, T {r0['seq']}, batch {r0['batch']}, vocab {VOCAB}, Adam, dropout 0; "
              f"{tokens:,} tokens per step")
        print("  model FLOPs per token: " + ", ".join(f"{f / 1e6:.2f} M" for f in sorted(fpt))
              + ("" if len(fpt) == 1 else "  (MISMATCH between the sides)"))
        nw = {r["n_weights"] for r in train}
        print("  weights: " + ", ".join(f"{n:,}" for n in sorted(nw))
              + ("" if len(nw) == 1 else "  (MISMATCH between the sides)"))
        kernels = sorted({r["blas_core"] for r in rs})
        print("  OpenBLAS kernel: " + ", ".join(kernels) + ("" if len(kernels) == 1 else "  (NOT THE SAME)"))
        for impl in ("ctrax", "torch"):
            waits = sorted({r.get("wait", "?") for r in train if r["impl"] == impl})
            if waits:
                print(f"  {impl} idle threads: " + ", ".join(waits))
        # Per run: tokens/s from the median timed step; the spread over runs.
        peak, peak_cpu, fma, best_shape = {}, {}, {}, {}
        for r in rs:
            if r["impl"] == "sgemm":
                peak.setdefault(r["threads"], []).append(r["gflops"] * 1e9)
                if "best_gflops" in r:
                    best_shape.setdefault(r["threads"], []).append(r["best_gflops"] * 1e9)
                if "gflops_cpu" in r:
                    peak_cpu.setdefault(r["threads"], []).append(r["gflops_cpu"] * 1e9)
                if r.get("fma_gflops", -1) > 0:
                    fma.setdefault(r["threads"], []).append(r["fma_gflops"] * 1e9)
        for n in sorted(peak):
            print(f"  sgemm (model's dense shapes, ctrax's products), {n} thread{'s' if n > 1 else ''}: "
                  f"{spread([p / 1e9 for p in peak[n]])} GFLOP/s over {len(peak[n])} runs"
                  + (f"; per CPU-s {spread([p / 1e9 for p in peak_cpu[n]])}" if n in peak_cpu else "")
                  # The MFU below divides by the step-weighted rate above, not
                  # by the fastest GEMM: the best single shape is printed too.
                  + (f"; best single shape {spread([p / 1e9 for p in best_shape[n]])}" if n in best_shape else ""))
            if n in fma:
                # The vector units' own limit, measured right after each
                # sgemm run: how close the GEMM itself comes to the hardware.
                print(f"  FMA peak (vector FMA chains on every thread), {n} thread{'s' if n > 1 else ''}: "
                      f"{spread([p / 1e9 for p in fma[n]])} GFLOP/s; the sgemm rate is "
                      f"{statistics.median(peak[n]) / statistics.median(fma[n]) * 100:.0f}% of it")
                # The same loop on the same cores should not move: when it
                # does, something else took the cores during the run.
                if max(fma[n]) > 1.15 * min(fma[n]):
                    print(f"  NOTE: the FMA peak moved {max(fma[n]) / min(fma[n]):.2f}x between runs: other "
                          "work shared these cores, so the ratios below carry that noise; rerun when idle")
        print(f"  {'side':<6} {'threads':>7} {'runs':>4} {'tokens/s (median)':>18} {'runs spread':>15} "
              f"{'step spread':>15} {'MFU':>10} {'peak RSS MiB':>13} {'tokens/CPU-s':>13} {'MFU by CPU':>10}")
        best, cpu_rate = {}, {}
        for impl in ("ctrax", "torch"):
            for n in sorted({r["threads"] for r in train if r["impl"] == impl}):
                sel = [r for r in train if r["impl"] == impl and r["threads"] == n]
                tps = [tokens / statistics.median(r["wall_s"]) for r in sel]
                steps = [tokens / w for r in sel for w in r["wall_s"]]
                med = statistics.median(tps)
                pk = statistics.median(peak[n]) if n in peak else None
                mfu = [tokens / statistics.median(r["wall_s"]) * r["flops_per_token"] / pk for r in sel] if pk else []
                rss = [r["peak_rss"] / MIB for r in sel]
                # Tokens per second of process CPU time: the work, whatever
                # the load (with 2 threads both threads' time counts).
                per_cpu = statistics.median(tokens / statistics.median(r["cpu_s"]) for r in sel)
                # The same ratio in CPU time on both sides of the division.
                mfu_cpu = (per_cpu * sel[0]["flops_per_token"] / statistics.median(peak_cpu[n])
                           if n in peak_cpu else None)
                print(f"  {impl:<6} {n:>7} {len(sel):>4} {med:>18,.0f} {spread(tps):>15} {spread(steps):>15} "
                      f"{spread([m * 100 for m in mfu], '{:.0f}%'):>10} {spread(rss):>13} {per_cpu:>13,.0f} {'-' if mfu_cpu is None else f'{mfu_cpu * 100:.0f}%':>10}")
                cpu_rate[impl, n] = per_cpu
                if impl not in best or med > best[impl][0]:
                    best[impl] = (med, n, tps, mfu, statistics.median(rss), mfu_cpu)
        if len(best) < 2:
            continue
        (c_med, c_n, c_tps, c_mfu, c_rss, c_mfu_cpu), (t_med, t_n, t_tps, _, t_rss, _) = best["ctrax"], best["torch"]
        ratio = c_med / t_med
        lo, hi = min(c_tps) / max(t_tps), max(c_tps) / min(t_tps)
        print(f"  best: ctrax {c_med:,.0f} tokens/s at {c_n} thread(s), PyTorch {t_med:,.0f} at {t_n}; "
              f"ratio ctrax/PyTorch {ratio:.2f} (run extremes {lo:.2f}-{hi:.2f}); "
              f"peak RSS ctrax/PyTorch {c_rss:,.0f} / {t_rss:,.0f} MiB = {c_rss / t_rss:.2f}")
        # What the ratio could be at most if ctrax ran every model FLOP at
        # the GEMM's own rate (no time outside the GEMM, no packing beyond
        # the sgemm run's): the sgemm rate over PyTorch's model FLOP rate.
        if c_n in peak:
            ceiling = statistics.median(peak[c_n]) / (t_med * r0["flops_per_token"])
            need = TARGET_RATIO.get(cfg)
            print(f"  ratio ceiling at the sgemm rate: {ceiling:.2f} (ctrax at 100% MFU against PyTorch's "
                  f"{t_med:,.0f} tokens/s)" + (f"; the {need}x target needs ctrax at "
                                               f"{need / ceiling * 100:.0f}% MFU" if need else ""))
        if c_n in best_shape and t_n in best_shape:
            # MFU against the fastest of the model's GEMM shapes instead of
            # their step-weighted rate: the stricter reading of "sgemm peak".
            print(f"  MFU of the best single-shape sgemm rate: ctrax "
                  f"{c_med * r0['flops_per_token'] / statistics.median(best_shape[c_n]) * 100:.0f}%, PyTorch "
                  f"{t_med * r0['flops_per_token'] / statistics.median(best_shape[t_n]) * 100:.0f}%")
        if c_n in fma and t_n in fma:
            print(f"  of the FMA peak: ctrax {c_med * r0['flops_per_token'] / statistics.median(fma[c_n]) * 100:.0f}%, "
                  f"PyTorch {t_med * r0['flops_per_token'] / statistics.median(fma[t_n]) * 100:.0f}%")
        # The load-independent view: work per CPU-second at one thread.
        if ("ctrax", 1) in cpu_rate and ("torch", 1) in cpu_rate:
            print(f"  tokens per CPU-second at 1 thread, ctrax/PyTorch: "
                  f"{cpu_rate['ctrax', 1] / cpu_rate['torch', 1]:.2f}")
        if cfg in TARGET_RATIO:
            verdicts.append((ratio >= TARGET_RATIO[cfg],
                             f"{cfg}: tokens/s ctrax / PyTorch {ratio:.2f} (target >= {TARGET_RATIO[cfg]})"))
        if cfg in TARGET_MFU and c_mfu:
            # Both measures must pass: on a loaded machine the wall-clock one
            # divides rates taken under different loads (it can exceed 100%).
            m = statistics.median(c_mfu)
            verdicts.append((min(m, m if c_mfu_cpu is None else c_mfu_cpu) >= TARGET_MFU[cfg],
                             f"{cfg}: ctrax MFU {m * 100:.0f}% of the {c_n}-thread sgemm rate "
                             f"(target >= {TARGET_MFU[cfg] * 100:.0f}%, both ways; by CPU time "
                             + ("-" if c_mfu_cpu is None else f"{c_mfu_cpu * 100:.0f}%") + ")"))
        if cfg in TARGET_RSS:
            verdicts.append((c_rss <= TARGET_RSS[cfg] * t_rss,
                             f"{cfg}: peak RSS ctrax / PyTorch {c_rss / t_rss:.2f} (target <= {TARGET_RSS[cfg]})"))
    if verdicts:
        print("\nIssue 13's targets (best thread count of each side, medians over runs):")
        for ok, what in verdicts:
            print(("PASS " if ok else "FAIL ") + what)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="A")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=20, help="steps, the first one untimed (>= 2)")
    ap.add_argument("--table", metavar="JSONL", help="print the table of the JSON lines in this file")
    a = ap.parse_args()
    if a.table:
        table(a.table)
        return
    if a.steps < 2 or a.threads < 1:
        sys.exit("torch_lm_speed.py: --steps must be >= 2 and --threads >= 1")
    worker(a)


if __name__ == "__main__":
    main()
