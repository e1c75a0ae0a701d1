#!/usr/bin/python3
"""Trax's TransformerLM and ReformerLM in float64 numpy, run by
tests/lm_reference_test.sh on what tests/lm_reference.c writes:

    /usr/bin/python3 tests/lm_reference.py CASE.safetensors...

Each CASE file holds the batch (inputs, targets (B, T) i32, weights (B, T)
f32), ctrax's eval loss on it (loss_eval), the evaluator's on its tokens
at loss weights 1 (loss_evaluator) and the gradient ("grad/<weight>"),
and as metadata the model's settings and the directory of the checkpoint
whose weights.safetensors holds the weights, by layer path. The model is
written here from Trax's source, not from ctrax's (google/trax, the files
named at each function), with only the weights taken from the checkpoint:
  TransformerLM (trax/models/transformer.py): ShiftRight, Embedding,
    Dropout, PositionalEncoding, n_layers x _DecoderBlock [Residual(LayerNorm,
    CausalAttention, Dropout), Residual(LayerNorm, Dense(d_ff), Relu, Dropout,
    Dense(d_model), Dropout)], LayerNorm, Dense(vocab_size).
  ReformerLM (trax/models/reformer/reformer.py; /work/shared/REFORMER.md
    section 1): ShiftRight, Embedding, Dropout, PositionalEncoding, Dup,
    n_layers x [y1 = x1 + SelfAttention(LayerNorm(x2)), y2 = x2 + FF(y1)],
    Concatenate, LayerNorm, Dropout, Dense(vocab_size); SelfAttention
    (trax/layers/research/efficient_attention.py) full (chunk_len None) and
    causal; FF = LayerNorm, Dense(d_ff), Dropout, FastGelu, Dense, Dropout.
  WeightedCategoryCrossEntropy (trax/layers/metrics.py):
    sum(ce * w) / sum(w), ce = -sum(one_hot(t) * log_softmax(logits)).
In eval mode every Dropout is the identity. The reversible blocks compute
the plain residual function written above in the forward pass.

Checks, each printed with its numbers:
  - both eval losses within 1e-6 relative of the reference's (2e-8 measured,
    float32 sums; TransformerLM's LayerNorm epsilon at 1e-5 for Trax's 1e-6
    moved it 1.5e-3, FastGelu's 0.044715 at 0.04 3.3e-5);
  - the gradient: every weight tensor, at 3 elements drawn here, against
    float64 central differences of the reference (eps 1e-6), within 1e-4 of
    the norm over the sampled elements (2e-7 measured).
One line per case: "ok CASE ..." or "FAIL CASE ...".
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from read_safetensors import read  # noqa: E402

LOSS_TOL = 1e-6
GRAD_TOL = 1e-4
GRAD_EPS = 1e-6


def layer_norm(x, scale, bias):
    # normalization.py LayerNorm.forward: epsilon=1e-6, variance of centered.
    mean = x.mean(-1, keepdims=True)
    centered = x - mean
    variance = (centered * centered).mean(-1, keepdims=True)
    return centered / np.sqrt(variance + 1e-6) * scale + bias


def dense(x, w, p):
    # core.py Dense: x @ kernel + bias, kernel (d_in, d_out).
    return x @ w[p + "/kernel"] + w[p + "/bias"]


def relu(x):
    return np.maximum(x, 0.0)


def fast_gelu(x):
    # activation_fns.py FastGelu.
    return 0.5 * x * (1 + np.tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))


def shift_right_embed(w, model, tokens):
    # ShiftRight(1): pad one 0 on the left of axis 1, drop the last; then
    # Embedding (weights[ids]) and PositionalEncoding (x + table[:T]).
    shifted = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)
    x = w[model + "/Embedding[1]/embedding"][shifted]
    return x + w[model + "/PositionalEncoding[3]/embedding"][: tokens.shape[1]]


def causal_attention(x, w, p, n_heads):
    # attention.py CausalAttention: Dense q, k, v (d_model each), split into
    # heads (B, T, H, d) -> (B, H, T, d) (SplitIntoHeads), DotProductAttention
    # with the causal mask (dots / sqrt(d_head), -1e9 where key > query,
    # softmax), merged back, then the output Dense.
    b, t, d = x.shape
    dh = d // n_heads

    def heads(y):
        return y.reshape(b, t, n_heads, dh).transpose(0, 2, 1, 3)

    q = heads(dense(x, w, p + "/Branch[0]/Parallel[1]/Dense[0]"))
    k = heads(dense(x, w, p + "/Branch[0]/Parallel[1]/Dense[1]"))
    v = heads(dense(x, w, p + "/Branch[0]/Parallel[1]/Dense[2]"))
    dots = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh)
    mask = np.tril(np.ones((t, t), dtype=bool))
    dots = np.where(mask, dots, -1e9)
    dots = np.exp(dots - dots.max(-1, keepdims=True))
    dots /= dots.sum(-1, keepdims=True)
    o = (dots @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return dense(o, w, p + "/Dense[2]")


def self_attention(x, w, p, n_heads):
    # efficient_attention.py SelfAttention, chunk_len None, causal, no bias:
    # per head q = x Wq, k = x Wk / sqrt(d_qk) (attend), v = x Wv; dots q.k,
    # minus 1e9 where query position < key position; softmax; o Wo, summed
    # over heads.
    t = x.shape[1]
    causal = np.arange(t)[:, None] < np.arange(t)[None, :]
    y = 0.0
    for h in range(n_heads):
        q = x @ w[f"{p}/Wq[{h}]"]
        k = x @ w[f"{p}/Wk[{h}]"]
        k = k / np.sqrt(k.shape[-1])
        v = x @ w[f"{p}/Wv[{h}]"]
        dots = q @ k.transpose(0, 2, 1) - 1e9 * causal
        dots = np.exp(dots - dots.max(-1, keepdims=True))
        dots /= dots.sum(-1, keepdims=True)
        y = y + (dots @ v) @ w[f"{p}/Wo[{h}]"]
    return y


def transformer_lm(w, meta, tokens):
    # transformer.py TransformerLM / _DecoderBlock / _FeedForwardBlock.
    m = "TransformerLM"
    x = shift_right_embed(w, m, tokens)
    n_layers = int(meta["n_layers"])
    for i in range(n_layers):
        blk = f"{m}/DecoderBlock[{4 + i}]"
        a = f"{blk}/Residual[0]/Branch[0]/Parallel[1]/Serial[1]"
        y = layer_norm(x, w[a + "/LayerNorm[0]/scale"], w[a + "/LayerNorm[0]/bias"])
        x = x + causal_attention(y, w, a + "/CausalAttention[1]", int(meta["n_heads"]))
        f = f"{blk}/Residual[1]/Branch[0]/Parallel[1]/Serial[1]"
        y = layer_norm(x, w[f + "/LayerNorm[0]/scale"], w[f + "/LayerNorm[0]/bias"])
        x = x + dense(relu(dense(y, w, f + "/Dense[1]")), w, f + "/Dense[4]")
    k = 4 + n_layers
    x = layer_norm(x, w[f"{m}/LayerNorm[{k}]/scale"], w[f"{m}/LayerNorm[{k}]/bias"])
    return dense(x, w, f"{m}/Dense[{k + 1}]")


def reformer_lm(w, meta, tokens):
    # reformer.py ReformerLM, its DecoderBlock as REFORMER.md section 1 reads it.
    m = "ReformerLM"
    x1 = x2 = shift_right_embed(w, m, tokens)
    n_layers = int(meta["n_layers"])
    for i in range(n_layers):
        a = f"{m}/ReversibleSerial[5]/ReversibleHalfResidualAttn[{4 * i}]/Serial[0]"
        y = layer_norm(x2, w[a + "/LayerNorm[0]/scale"], w[a + "/LayerNorm[0]/bias"])
        x1 = x1 + self_attention(y, w, a + "/SelfAttention[1]", int(meta["n_heads"]))
        f = f"{m}/ReversibleSerial[5]/ReversibleHalfResidualFF[{4 * i + 2}]/Serial[0]"
        y = layer_norm(x1, w[f + "/LayerNorm[0]/scale"], w[f + "/LayerNorm[0]/bias"])
        x2 = x2 + dense(fast_gelu(dense(y, w, f + "/Dense[1]")), w, f + "/Dense[4]")
    x = np.concatenate([x1, x2], axis=-1)
    x = layer_norm(x, w[f"{m}/LayerNorm[7]/scale"], w[f"{m}/LayerNorm[7]/bias"])
    return dense(x, w, f"{m}/Dense[9]")


MODELS = {"TransformerLM": transformer_lm, "ReformerLM": reformer_lm}


def weighted_ce(logits, targets, weights):
    # metrics.py WeightedCategoryCrossEntropy / _category_cross_entropy.
    z = logits - logits.max(-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(-1, keepdims=True))
    ce = -np.take_along_axis(log_p, targets[..., None], -1)[..., 0]
    return (ce * weights).sum() / weights.sum()


def check(path):
    case = os.path.basename(path).split(".")[0]
    t, meta = read(path)
    d = meta["checkpoint"]
    with open(os.path.join(d, "checkpoint")) as f:
        wt, _ = read(os.path.join(d, f.read().strip(), "weights.safetensors"))
    w = {k: a.astype(np.float64) for k, (_, _, a) in wt.items()}
    tokens, targets = t["inputs"][2], t["targets"][2]
    weights = t["weights"][2].astype(np.float64)
    model = MODELS[meta["model"]]

    def loss(w):
        return weighted_ce(model(w, meta, tokens), targets, weights)

    ref = loss(w)
    got = float(t["loss_eval"][2][0])
    loss_rel = abs(got - ref) / abs(ref)
    print(f"{case}: eval loss ctrax {got:.8f}, reference {ref:.8f}, rel diff {loss_rel:.2e} (tol {LOSS_TOL:g})")
    ref1 = weighted_ce(model(w, meta, tokens), targets, np.ones_like(weights))
    got1 = float(t["loss_evaluator"][2][0])
    loss_rel = max(loss_rel, abs(got1 - ref1) / abs(ref1))
    print(f"{case}: evaluator at weights 1: ctrax {got1:.8f}, reference {ref1:.8f}, "
          f"rel diff {abs(got1 - ref1) / abs(ref1):.2e}")

    rng = np.random.default_rng(0)
    dd = aa = nn = 0.0
    n = 0
    for name in sorted(w):
        ga = t["grad/" + name][2].ravel().astype(np.float64)
        flat = w[name].reshape(-1)
        for k in rng.choice(flat.size, size=min(3, flat.size), replace=False):
            saved = flat[k]
            flat[k] = saved + GRAD_EPS
            lp = loss(w)
            flat[k] = saved - GRAD_EPS
            lm = loss(w)
            flat[k] = saved
            g = (lp - lm) / (2 * GRAD_EPS)
            dd += (ga[k] - g) ** 2
            aa += ga[k] ** 2
            nn += g * g
            n += 1
    grad_rel = np.sqrt(dd) / max(np.sqrt(nn), 1e-12)
    print(f"{case}: gradient at {n} elements of {len(w)} weights: |ctrax - central differences| / |grad| "
          f"{grad_rel:.2e} (|grad| {np.sqrt(nn):.3e}, tol {GRAD_TOL:g})")
    good = loss_rel < LOSS_TOL and grad_rel < GRAD_TOL
    print(f"{'ok' if good else 'FAIL'} {case} loss rel {loss_rel:.2e} grad rel {grad_rel:.2e}")
    return good


def main():
    results = [check(p) for p in sys.argv[1:]]
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
