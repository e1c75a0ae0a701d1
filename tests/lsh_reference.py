#!/usr/bin/python3
"""LSHSelfAttention's forward against a float64 numpy reference written from
REFORMER.md section 2 (Trax's LSH attention), not from ctrax's C code.

    /usr/bin/python3 tests/lsh_reference.py FILE...

Each FILE is one that tests/lsh_reference.c writes (one per case: parameters,
x, mask, weights, rotations, the state's buckets after a training forward,
and the outputs of that training forward and of an eval forward). For each
case the reference hashes q with the rotations the layer drew, checks the
training forward's buckets against the state's, then attends and compares
both outputs. One line per case; exits 1 on any mismatch.

Tolerances, per output row (b, t), relative to the sum of the magnitudes of
the terms that make it, sum_h |o_h| |Wo_h| (a float32 computation errs by a
few ulps of that sum, whatever the cancellations):
  - 1e-5 for a row whose every head has, in some round, a target without a
    penalty. float32 dots, exps and sums of a few dozen terms land within
    about 1e-6 of that scale (the figures are printed); a wrong target,
    position or round moves the row by a good fraction of it.
  - 2e-2 for a row where some head's query has only its own copies to
    attend to in every round (causal position 0, or a query whose window
    holds only later positions and padding). Its scores sit near -1e5,
    where a float32 ulp is 2^-7: lsh_attention.h allows such a row to be
    off by ~0.4% (as Trax, whose p = exp(dots - lse) takes a float32
    logsumexp rounded by up to 2^-8), and 2e-2 leaves room for a few such
    roundings. The layer's forward normalises each row by its sum and
    lands within ~1e-7 here (printed); every round of such a query gives
    its own value vector, so the rounds' weights do not matter either.
  - not compared: a row where some head's query (necessarily at padding)
    has only penalties of 1e9 or more in every round, i.e. only padding,
    later positions and itself to attend to. Near -1e9 a float32 ulp is 64,
    so the dots are rounded away and the float32 result is a plain average
    of such keys while the float64 one still weighs them by their dots;
    neither means anything (lsh_attention.h: outputs at padding are whatever
    their window gives). The count of such rows is printed.
Buckets: exact. A near tie in the argmax (a runner-up within 1e-5 of the
scale of the rotated value, where float32 and float64 may pick apart) would
be accepted if the layer picked either and is counted; none occurs here.
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_safetensors import read  # noqa: E402

TIGHT, SELF_ONLY, TIE = 1e-5, 2e-2, 1e-5
CAUSAL_PENALTY, SELF_PENALTY, PAD_PENALTY = 1e9, 1e5, 1e9


def bucket_factors(n_buckets, T, m):
    """n_buckets ("f1,f2,..." or "" for None) as a list of factors: the
    parameter, or Trax's from the length (nb = 2 max(1, T // m), factored
    over 128)."""
    if n_buckets:
        return [int(f) for f in n_buckets.split(",")]
    nb = 2 * max(1, T // m)
    if nb <= 128:
        return [nb]
    f1 = 2 ** int(np.ceil(np.log2(np.sqrt(nb))))
    return [f1, 2 * (nb // (2 * f1))]


def hash_buckets(q, rot, factors, valid):
    """Buckets (R, T) of q (T, dk) under rot (dk, R, n_rot): per factor j,
    argmax of concat(z, -z) over its columns, combined as sum_j b_j
    prod_{i<j} f_i; padding (valid False) in the extra bucket; round offsets
    r NB added. Also, per factor, which indices are within TIE of the max
    (R, T, f_j), to tell a near tie from a mismatch, and NB."""
    z = np.einsum("ti,irc->rtc", q, rot)
    zabs = np.einsum("ti,irc->rtc", np.abs(q), np.abs(rot))
    R, T = z.shape[:2]
    buckets, stride, c0, near = np.zeros((R, T), np.int64), 1, 0, []
    for f in factors:
        cols = slice(c0, c0 + f // 2)
        zz = np.concatenate([z[..., cols], -z[..., cols]], axis=-1)
        scale = np.concatenate([zabs[..., cols], zabs[..., cols]], axis=-1).max(axis=-1, keepdims=True)
        buckets += stride * np.argmax(zz, axis=-1)
        near.append(zz >= zz.max(axis=-1, keepdims=True) - TIE * scale)
        stride, c0 = stride * f, c0 + f // 2
    NB = stride
    if valid is not None:
        buckets[:, ~valid] = NB
        NB += 1
    return buckets + NB * np.arange(R)[:, None], near, NB


def check_buckets(got, want, near, factors, NB):
    """(exact, near ties, mismatches) of got (R T) against want (R, T)."""
    got = got.reshape(want.shape).astype(np.int64)
    diff = np.argwhere(got != want)
    n_tie = 0
    for r, t in diff:
        b, ok = got[r, t] - r * NB, True
        if b < 0 or b >= np.prod(factors) or want[r, t] - r * NB >= np.prod(factors):
            ok = False  # out of range, or the padding bucket: no tie there
        else:
            for j, f in enumerate(factors):
                ok &= bool(near[j][r, t, b % f])
                b //= f
        n_tie += ok
    return got.size - len(diff), n_tie, len(diff) - n_tie


def look_adjacent(a, before, after):
    """(N, m, ...) -> (N, m (1 + before + after), ...): chunk c followed by
    its neighbours c + j, j = -before..after, as Trax's slicing a[j:] ++
    a[:j] gives them: (c + j) mod N while |j| < N, chunk c itself beyond
    (a slice past either end is all or nothing)."""
    parts = [a if j == 0 else np.concatenate([a[j:], a[:j]]) for j in range(-before, after + 1)]
    return np.concatenate(parts, axis=1)


def logsumexp(a, axis):
    mx = a.max(axis=axis, keepdims=True)
    return (mx + np.log(np.exp(a - mx).sum(axis=axis, keepdims=True))).squeeze(axis)


def attend(q, v, buckets, valid, P, drop=None):
    """One (b, h): q (T, dk), v (T, dv), buckets (R, T) -> o (T, dv) and, per
    position, the smallest penalty of the best round (0: a real target).
    drop (m, W), in training: the attention dropout's multipliers (keep /
    keep_prob), as Trax's attend applies them: on the probabilities exp(dots
    - lse) of every sorted chunk (one mask broadcast over the chunks, so
    over rounds too), after lse is taken, which therefore combines the
    rounds undropped."""
    T, dk = q.shape
    R, m = P["n_hashes"], P["chunk_len"]
    L = R * T
    ticker = np.arange(L)
    perm = np.argsort(T * buckets.reshape(L) + ticker % T)  # keys all distinct
    undo = np.argsort(perm)
    pos = perm % T
    sq, sv = q[pos], v[pos]
    sk = sq / np.sqrt(np.mean(sq**2, axis=-1, keepdims=True) + 1e-6) / np.sqrt(dk)
    N = L // m
    kv = [look_adjacent(a.reshape((N, m) + a.shape[1:]), P["n_chunks_before"], P["n_chunks_after"])
          for a in (sk, sv, pos, valid[pos])]
    k_w, v_w, kpos, kvalid = kv
    qpos = pos.reshape(N, m)[:, :, None]
    dots = np.einsum("nid,njd->nij", sq.reshape(N, m, dk), k_w)
    penalty = SELF_PENALTY * (qpos == kpos[:, None, :]) + PAD_PENALTY * ~kvalid[:, None, :]
    if P["causal"]:
        penalty += CAUSAL_PENALTY * (qpos < kpos[:, None, :])
    dots -= penalty
    lse = logsumexp(dots, axis=-1)
    p = np.exp(dots - lse[..., None])
    if drop is not None:
        if drop.shape != p.shape[1:]:
            raise ValueError(f"attention dropout multipliers {drop.shape}, a chunk's probabilities {p.shape[1:]}")
        p = p * drop
    so = np.einsum("nij,njd->nid", p, v_w).reshape(L, -1)
    o_r = so[undo].reshape(R, T, -1)
    lse_r = lse.reshape(L)[undo].reshape(R, T)
    least = penalty.min(axis=-1).reshape(L)[undo].reshape(R, T)
    w = np.exp(lse_r - logsumexp(lse_r, axis=0))
    o = (w[..., None] * o_r).sum(axis=0)
    return o, least.min(axis=0)


def forward(x, valid, W, rot, P):
    """x (B, T, D), rot (B H, dk, R, n_rot) -> y (B, T, D), the magnitude
    scale (B, T, D), each row's worst least penalty over heads (B, T), the
    buckets with their near ties and NB per (b, h), and the factors."""
    B, T, D = x.shape
    H = P["n_heads"]
    factors = bucket_factors(P["n_buckets"], T, P["chunk_len"])
    if rot.shape[-1] != sum(f // 2 for f in factors):
        raise ValueError(f"rotations of width {rot.shape[-1]}, factors {factors}")
    y, scale, worst = np.zeros((B, T, D)), np.zeros((B, T, D)), np.zeros((B, T))
    hashed = []
    for b in range(B):
        for h in range(H):
            q, v = x[b] @ W["Wq"][h], x[b] @ W["Wv"][h]
            buckets, near, NB = hash_buckets(q, rot[b * H + h], factors, valid[b] if P["masked"] else None)
            hashed.append((buckets, near, NB))
            o, least = attend(q, v, buckets, valid[b], P)
            y[b] += o @ W["Wo"][h]
            scale[b] += np.abs(o) @ np.abs(W["Wo"][h])
            worst[b] = np.maximum(worst[b], least)
    return y, scale, worst, hashed, factors


def compare(got, want, scale, worst, valid):
    """Per row class, tight and self-only: (max |got - want| / scale, row
    count); and the count of rows excluded."""
    if np.any((worst >= PAD_PENALTY) & valid):
        raise AssertionError("a real position with only penalties of 1e9: the reference is wrong")
    rel = (np.abs(got - want) / scale).max(axis=-1)
    classes = (worst == 0, (worst > 0) & (worst < PAD_PENALTY))
    return [(rel[c].max(initial=0.0), int(c.sum())) for c in classes], int((worst >= PAD_PENALTY).sum())


def run(path):
    tensors, meta = read(path)
    a = {k: v[2].astype(np.float64) for k, v in tensors.items()}
    P = {k: int(v) for k, v in meta.items() if k not in ("what", "n_buckets")}
    P["n_buckets"] = meta["n_buckets"]
    x = a["x"]
    B, T, _ = x.shape
    valid = a["mask"] != 0 if P["masked"] else np.ones((B, T), bool)
    errs, notes = [], []
    for mode in ("train", "eval"):
        y, scale, worst, hashed, factors = forward(x, valid, a, a["rot_" + mode], P)
        if mode == "train":
            got = a["buckets_train"]
            n_ok = n_tie = n_bad = 0
            for s, (buckets, near, NB) in enumerate(hashed):
                ok, tie, bad = check_buckets(got[s], buckets, near, factors, NB)
                n_ok, n_tie, n_bad = n_ok + ok, n_tie + tie, n_bad + bad
            notes.append(f"buckets {n_ok}/{got.size} exact, {n_tie} near ties, factors {factors}")
            if n_bad:
                errs.append(f"{n_bad} buckets differ")
        ((tight, n_tight), (self_only, n_self)), n_excl = compare(a["y_" + mode], y, scale, worst, valid)
        notes.append(f"{mode}: {n_tight} rows within {tight:.1e} (tol {TIGHT:g}), {n_self} self-only within "
                     f"{self_only:.1e} (tol {SELF_ONLY:g}), {n_excl} excluded")
        if not (tight <= TIGHT and self_only <= SELF_ONLY):
            errs.append(f"{mode} output over tolerance")
    name = os.path.basename(path).rsplit(".", 1)[0]
    verdict = f"FAIL {name} ({', '.join(errs)})" if errs else f"ok {name}"
    print(f"{verdict}: {'; '.join(notes)}")
    return not errs


def main():
    if len(sys.argv) < 2:
        print("usage: lsh_reference.py FILE...")
        sys.exit(2)
    results = [run(p) for p in sys.argv[1:]]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
