#!/usr/bin/python3
"""PyTorch side of bench/long_context (issue 12), and the table of both sides.

Trains, in PyTorch (Debian's python3-torch, CPU), the architecture of Trax's
reformer test model that build/bench_long_context trains with ctrax's
memory-efficient trainer -- vocab 256, d_model 256, d_ff 512,
d_qk = d_v = 64, 2 layers, 2 heads, dropout 0.05, Relu, batch 1 of random
bytes, Adam -- but with FULL causal attention (T x T scores: PyTorch 1.13 has
no memory-efficient attention on CPU) and torch.utils.checkpoint around each
layer, at the same sequence lengths T.

Which model is "the same" (the fair comparison):
  ctrax's ReformerLM carries two halves x1, x2 of d_model 256 each; a layer
  is x1 += Attention(LayerNorm(x2)), x2 += FF(LayerNorm(x1)); the halves are
  concatenated at the end (LayerNorm(512), Dense(512 -> vocab)). This file
  builds exactly that two-stream network, not reversible (PyTorch has no
  reversible layers): the same weights (shapes and count, printed), the same
  per-token FLOPs outside attention, the same dropouts. A plain pre-LN
  decoder with d_model 512 would have about four times the dense weights and
  FLOPs; one with d_model 256 would miss the two-stream output layer. So the
  only differences left are the ones under test: the attention (full T x T
  instead of chunked SelfAttention and LSHSelfAttention; layer 1 keeps
  LSHSelfAttention's shared QK, k = RMS-normalised q / sqrt(d_qk), and its
  self mask) and how activations are kept (checkpoint recomputation instead
  of reversible recomputation). The feed-forward is not chunked
  (ff_chunk_size): its (T, 512) activations are small next to T x T scores.

Memory need of full attention, predicted before running (never let a run
OOM the machine): need(T) = RSS after init + FIXED + (H BYTES_PER_SCORE + 1) T^2.
The T^2 term is the attention of the one layer being recomputed in the
checkpointed backward: per score element (H = 2 heads, batch 1) the saved
softmax output (4 bytes), dropout mask (1) and dropped probabilities (4) and
the 4-byte gradients and temporaries of the moment, about 20.5 bytes, plus
the T x T bool causal mask (1 byte per T^2). The constants fit the peaks
measured here at T = 2048 and 4096 (265 and 764 MiB above the RSS after
init, 2 threads): 41.6 bytes per T^2 and FIXED = 100 MiB (thread pools,
allocator); everything linear in T is small next to them at these T. A T
whose need exceeds the budget (--budget-gib, default 12 GiB, and at most
60% of MemAvailable) is not run: its JSON line says "skipped" with the
predicted need. Runs that do happen carry the prediction next to the
measured peak, so the formula is checked wherever it can be.

    /usr/bin/python3 bench/torch_long_context.py --seq T [--steps 4] [--threads 2]
        [--budget-gib 12]                     # one T: one JSON line
    /usr/bin/python3 bench/torch_long_context.py --table results.jsonl
                                              # the table of both sides

bench/long_context.sh runs both sides, T by T, and calls --table. Peak RSS
is VmHWM of the process (one process per T); step time over steps 2..S,
wall clock and process CPU time.
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

MIB = 1024.0 * 1024.0
GIB = 1024.0 * MIB
HEADS = 2
BYTES_PER_SCORE = 20.5  # fitted (see the docstring)
FIXED = 100 * MIB


def rss_bytes():
    now = peak = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                now = int(line.split()[1]) * 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    return now, peak


def mem_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 8 << 30


def predicted_need(seq, base):
    """Peak RSS predicted for full attention at length seq (see the docstring)."""
    return base + FIXED + (HEADS * BYTES_PER_SCORE + 1) * seq * seq


# ---- one T, in this process ---------------------------------------------------------


def worker(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.set_num_threads(a.threads)
    torch.manual_seed(1)
    T, V, d, dff, dk, p = a.seq, 256, 256, 512, 64, 0.05

    budget = min(a.budget_gib * GIB, 0.6 * mem_available())
    base, _ = rss_bytes()
    need = predicted_need(T, base)
    if need > budget:
        print(json.dumps({"impl": "torch", "seq": T, "skipped": True, "predicted_peak_rss": need,
                          "budget": budget}))
        print(f"  torch T {T}: not run, predicted peak RSS {need / MIB:,.0f} MiB > budget {budget / MIB:,.0f} MiB",
              file=sys.stderr)
        return

    def channel_dropout(y, training):
        # Trax's output dropout in SelfAttention/LSHSelfAttention: one (D,)
        # mask for every position (as ctrax).
        if not training:
            return y
        keep = (torch.rand(y.shape[-1]) >= p).to(y.dtype) / (1 - p)
        return y * keep

    class Attention(nn.Module):
        """Full causal attention with the weights of SelfAttention (shared_qk
        False) or LSHSelfAttention (shared_qk True): Wq, [Wk], Wv (256, 2 x 64),
        Wo (2 x 64, 256), no biases."""

        def __init__(self, shared_qk):
            super().__init__()
            self.shared_qk = shared_qk
            self.wq = nn.Linear(d, HEADS * dk, bias=False)
            self.wk = None if shared_qk else nn.Linear(d, HEADS * dk, bias=False)
            self.wv = nn.Linear(d, HEADS * dk, bias=False)
            self.wo = nn.Linear(HEADS * dk, d, bias=False)

        def forward(self, x, mask):
            def heads(t):
                return t.view(1, T, HEADS, dk).transpose(1, 2)  # (1, H, T, dk)

            q, v = heads(self.wq(x)), heads(self.wv(x))
            if self.shared_qk:
                k = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6) / math.sqrt(dk)
                s = q @ k.transpose(-1, -2)  # (1, H, T, T)
                s.diagonal(dim1=-2, dim2=-1).sub_(1e5)  # a query does not attend to itself
            else:
                s = (q @ heads(self.wk(x)).transpose(-1, -2)) / math.sqrt(dk)
            s = s.masked_fill(mask, -1e9)
            att = F.dropout(torch.softmax(s, dim=-1), p, self.training)
            y = (att @ v).transpose(1, 2).reshape(1, T, HEADS * dk)
            return channel_dropout(self.wo(y), self.training)

    class Layer(nn.Module):
        """One ReformerLM layer without reversibility:
        x1 += Attention(LayerNorm(x2)); x2 += FF(LayerNorm(x1))."""

        def __init__(self, shared_qk):
            super().__init__()
            self.ln_a = nn.LayerNorm(d, eps=1e-6)
            self.att = Attention(shared_qk)
            self.ln_f = nn.LayerNorm(d, eps=1e-6)
            self.ff1, self.ff2 = nn.Linear(d, dff), nn.Linear(dff, d)

        def forward(self, x1, x2, mask):
            x1 = x1 + self.att(self.ln_a(x2), mask)
            y = F.relu(F.dropout(self.ff1(self.ln_f(x1)), p, self.training))
            x2 = x2 + F.dropout(self.ff2(y), p, self.training)
            return x1, x2

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
            self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))
            # SelfAttention, LSHSelfAttention, cycled as ctrax's attention list.
            self.layers = nn.ModuleList(Layer(shared_qk=i % 2 == 1) for i in range(a.layers))
            self.ln = nn.LayerNorm(2 * d, eps=1e-6)
            self.out = nn.Linear(2 * d, V)

        def forward(self, tokens):
            x = F.dropout(self.emb(F.pad(tokens, (1, 0))[:, :-1]), p, self.training) + self.pe
            x1 = x2 = x
            for layer in self.layers:
                x1, x2 = checkpoint(layer, x1, x2, self.mask, use_reentrant=False)
            x = torch.cat([x1, x2], dim=-1)
            return self.out(F.dropout(self.ln(x), p, self.training))

    model = LM()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, eps=1e-5)
    n_weights = sum(t.numel() for t in model.parameters())
    tokens = torch.randint(0, V, (1, T))
    weights = torch.ones(1, T)
    rss_init, _ = rss_bytes()
    need = predicted_need(T, rss_init)
    wall, cpu, losses = [], [], []
    for step in range(1, a.steps + 1):
        t0, c0 = time.perf_counter(), time.process_time()
        opt.zero_grad(set_to_none=True)
        logits = model(tokens)
        nll = F.cross_entropy(logits.reshape(-1, V), tokens.reshape(-1), reduction="none")
        loss = (nll * weights.reshape(-1)).sum() / weights.sum()  # WeightedCategoryCrossEntropy
        loss.backward()
        opt.step()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
        losses.append(float(loss))
        print(f"  torch T {T} step {step}: {wall[-1]:.2f} s (cpu {cpu[-1]:.2f} s), loss {losses[-1]:.4f}",
              file=sys.stderr, flush=True)
    _, peak = rss_bytes()
    print(json.dumps({"impl": "torch", "seq": T, "steps": a.steps, "n_weights": n_weights,
                      "rss_after_init": rss_init, "peak_rss": peak, "predicted_peak_rss": need,
                      "step1_s": wall[0], "wall_s": wall[1:], "cpu_s": cpu[1:],
                      "step_s": statistics.median(wall[1:]), "step_cpu_s": statistics.median(cpu[1:]),
                      "loss_first": losses[0], "loss_last": losses[-1]}))


# ---- the table of both sides ----------------------------------------------------------


def table(path):
    runs = [json.loads(l) for l in open(path) if l.startswith("{")]
    for r in runs:  # ctrax with a chunked loss is a side of its own
        if r.get("loss_chunk"):
            r["impl"] = f"ctrax lc{r['loss_chunk']}"
    seqs = sorted({r["seq"] for r in runs})
    sides = ["ctrax"] + sorted({r["impl"] for r in runs} - {"ctrax", "torch"}) + ["torch"]

    def of(impl, seq):
        return [r for r in runs if r["impl"] == impl and r["seq"] == seq]

    def ok(rs):
        return [r for r in rs if "error" not in r and not r.get("skipped")]

    def cpu_steps(rs):
        return [c for r in rs for c in r["cpu_s"]]

    def wall_steps(rs):
        return [c for r in rs for c in r["wall_s"]]

    def fmt_mib(b):
        return f"{b / MIB:,.0f}"

    n_rep = max(len(of("ctrax", s)) for s in seqs)
    print(f"\nlong_context: Trax's reformer test model (vocab 256, d_model 256, d_ff 512, d_qk = d_v = 64, "
          f"2 layers, 2 heads, dropout 0.05, batch 1, Adam); {n_rep} run(s) per T and side; load average "
          f"{os.getloadavg()[0]:.1f}.")
    print("ctrax: memory-efficient trainer, SelfAttention(chunk 64) + LSHSelfAttention(chunk 64, 32x32 buckets); "
          "'ctrax lcN': with loss_chunk_size N. torch: the same two-stream model, full causal attention, "
          "checkpoint per layer.")
    print("MiB = 2^20 bytes; peaks: the most over the runs; step times: median (least-most) over every "
          "timed step (2..S) of every run; cpu = process CPU time.\n")
    hdr = f"{'T':>6} {'side':<12} {'weights':>9} {'device peak':>12} {'RSS peak':>9} {'wall s':>8} " \
          f"{'cpu s':>8} {'cpu spread':>14}  note"
    print(hdr)
    print("-" * len(hdr))
    summary = {}
    for seq in seqs:
        for impl in sides:
            rs = of(impl, seq)
            if not rs:
                continue
            good = ok(rs)
            notes = [r["error"] for r in rs if "error" in r]
            skipped = [r for r in rs if r.get("skipped")]
            if skipped and not good:
                need = max(r["predicted_peak_rss"] for r in skipped)
                print(f"{seq:>6} {impl:<12} {'':>9} {'':>12} {'':>9} {'':>8} {'':>8} {'':>14}  not run: predicted "
                      f"peak RSS {need / GIB:,.1f} GiB > budget {skipped[0]['budget'] / GIB:,.1f} GiB")
                summary[impl, seq] = {"predicted": need}
                continue
            if not good:
                print(f"{seq:>6} {impl:<12}  error: {'; '.join(notes)}")
                continue
            cpu, wall = cpu_steps(good), wall_steps(good)
            dev = fmt_mib(max(r["peak_device"] for r in good)) if impl.startswith("ctrax") else "-"
            rss = max(r["peak_rss"] for r in good)
            note = "; ".join(notes)
            if impl == "torch":
                note = f"predicted {max(r['predicted_peak_rss'] for r in good) / MIB:,.0f} MiB" + \
                       (f"; {note}" if note else "")
            spread = f"{min(cpu):.2f}-{max(cpu):.2f}"
            print(f"{seq:>6} {impl:<12} {good[0]['n_weights']:>9,} {dev:>12} {fmt_mib(rss):>9} "
                  f"{statistics.median(wall):>8.2f} {statistics.median(cpu):>8.2f} {spread:>14}  {note}")
            summary[impl, seq] = {"device": max(r.get("peak_device", 0) for r in good), "rss": rss,
                                  "cpu": statistics.median(cpu), "wall": statistics.median(wall)}

    base = seqs[0]
    print(f"\nRatios to T = {base}")
    ctrax_sides = [x for x in sides if x.startswith("ctrax")]
    for side in ctrax_sides:
        for seq in seqs[1:]:
            c, c0 = summary.get((side, seq)), summary.get((side, base))
            if c and c0 and "device" in c and "device" in c0:
                print(f"  {side} T {seq}: device peak x{c['device'] / c0['device']:.2f}, "
                      f"RSS peak x{c['rss'] / c0['rss']:.2f}, step cpu x{c['cpu'] / c0['cpu']:.2f} "
                      f"(wall x{c['wall'] / c0['wall']:.2f}); T x{seq / base:g}")
    for seq in seqs:
        c, t = summary.get(("ctrax", seq)), summary.get(("torch", seq))
        if c and t and "rss" in c and "rss" in t:
            print(f"  T {seq}: torch / ctrax peak RSS {t['rss'] / c['rss']:.1f}, step cpu {t['cpu'] / c['cpu']:.2f}")
        elif c and t and "rss" in c and "predicted" in t:
            print(f"  T {seq}: torch / ctrax peak RSS {t['predicted'] / c['rss']:.0f} (torch predicted)")

    rc = 0
    for side in ctrax_sides:
        c4, c64 = summary.get((side, 4096)), summary.get((side, 65536))
        if c64 is None:
            continue
        print(f"\nIssue 12 acceptance ({side}, memory-efficient trainer):")
        if "device" not in c64:
            print("FAIL T = 65536 does not train")
            rc = 1
            continue
        r64 = ok(of(side, 65536))[0]
        print(f"PASS T = 65536 trains (loss {r64['loss_first']:.4f} -> {r64['loss_last']:.4f} "
              f"over {r64['steps']} steps)")
        checks = [("device peak(64K)", c64["device"] / MIB, 2048, " MiB")]
        if c4 and "device" in c4:
            checks.append(("device peak(64K) / peak(4K)", c64["device"] / c4["device"], 17, ""))
            checks.append(("step time(64K) / step time(4K), median CPU", c64["cpu"] / c4["cpu"], 20, ""))
            checks.append(("  (the same, median wall clock)", c64["wall"] / c4["wall"], 20, ""))
        for name, v, bound, unit in checks:
            good = v <= bound
            rc |= 0 if good or name.startswith("  ") else 1
            print(f"{'PASS' if good else 'FAIL'} {name}: {v:,.2f}{unit} (bound {bound:,}{unit})")
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, help="train at this T, print one JSON line")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget-gib", type=float, default=12.0)
    ap.add_argument("--table", help="a file of JSON lines from both sides: print the table")
    a = ap.parse_args()
    if a.table:
        sys.exit(table(a.table))
    if a.seq is None or a.steps < 2:
        ap.error("give --seq T (and --steps >= 2), or --table FILE")
    worker(a)


if __name__ == "__main__":
    main()
