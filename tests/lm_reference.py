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
    With attention_type LSHSelfAttention (efficient_attention.py; REFORMER.md
    section 2), causal: tests/lsh_reference.py's hashing (argmax of
    concat(qR, -qR), round offsets; n_buckets a list of factors as
    efficient_attention.py hash_vecs: factor j takes the next f_j / 2
    rotation columns, bucket = sum_j b_j prod_{i<j} f_i), sort by (bucket,
    position), chunked attention with look-back and wrap-around, the
    causal (-1e9) and self (-1e5) penalties, unsort and the softmax over
    the rounds' logsumexps, with the rotations ctrax drew
    ("rot_<forward>/<layer path>", read from its hash state by
    tests/lm_reference.c); the gradient holds each
    layer's buckets at those of the unperturbed weights (Trax's sort indices
    carry no gradient) and checks them against the ones ctrax's training
    forward stored ("buckets/<layer path>", exact). pos_type 'axial'
    (trax/layers/research/position_encodings.py AxialPositionalEncoding;
    REFORMER.md section 5): PE[t] = concat_k E_k[i_k], t = row-major digits
    (i_0, .., i_{K-1}) of pos_axial_shape. ff_chunk_size and loss_chunk_size
    (REFORMER.md section 4: Chunk / the chunked loss equal the whole at
    dropout 0) and the memory-efficient trainer (reversible backward by
    reconstruction) change nothing here: such a case is held to the same
    unchunked reference, only the weights' paths (.../Chunk[0]/...) differ.
  WeightedCategoryCrossEntropy (trax/layers/metrics.py):
    sum(ce * w) / sum(w), ce = -sum(one_hot(t) * log_softmax(logits)).
In eval mode every Dropout is the identity. The reversible blocks compute
the plain residual function written above in the forward pass.
Training mode (check_train; cases with "loss_train"): each Dropout
multiplies by keep / (1 - rate) at Trax's place, keep the mask ctrax drew
there ("mask/<layer path>", read by tests/lm_reference.c from each layer's
key: which elements drop is ctrax's, where and how they drop is this
file's). TransformerLM: after the embedding, on the attention
probabilities (B, H, T, T) before they weight the values (attention.py
DotProductAttention), after the attention and after the feed-forward's
Relu and second Dense. ReformerLM (SelfAttention): after the embedding,
the position table's channels (D,), SelfAttention's probabilities (one
(T, T) mask for all examples and heads, attend) and its output's channels
(D,) (apply_broadcasted_dropout), the feed-forward after its first Dense
(before FastGelu) and after its second, and after the final LayerNorm.
With LSHSelfAttention (forward_unbatched: attend_rng, output_rng =
split(rng), one rng for every example and head): attend's dropout on each
sorted chunk's probabilities exp(dots - lse), one (chunk_len, W) mask for
every chunk (so every round), after lse is taken (the rounds combine
undropped logsumexps; tests/lsh_reference.py attend), and each head's o Wo
times one (D,) mask. Axial positions: the table (B, n_0, .., D) times one
(B, 1, .., 1, D) mask (ReformerLM's dropout_broadcast_dims 1..K) before it
is added. ctrax's masks for ReformerLM's Dropouts are elementwise (not
Trax's shared_axes=[-2], a documented difference in models.h); chunked
(ff_chunk_size, loss_chunk_size) each chunk of rows draws its own, which
the driver stacks in row order over the B T rows: a chunk's mask reused
for another chunk leaves fewer rows, which this file refuses.

Checks, each printed with its numbers:
  - both eval losses within 1e-6 relative of the reference's (2e-8 measured,
    6e-8 with LSH, float32 sums; TransformerLM's LayerNorm epsilon at 1e-5
    for Trax's 1e-6 moved it 1.5e-3, FastGelu's 0.044715 at 0.04 3.3e-5;
    without LSH's self penalty 5e-2, its look-back 1.5e-2, its rounds
    averaged instead of weighted by their logsumexps 9e-3, an axial
    embedding's digits column-major 4e-2, feed-forward chunks shifted by one
    6e-2, the loss's last (short) chunk dropped 3e-3). The *_stream_small
    cases hold the whole residual stream at ~6e-3 of its trained scale
    (final LayerNorm's input variance ~1e-3 TransformerLM, ~1e-4
    ReformerLM, against 25 and 2.5 in the other cases): the final
    LayerNorm's epsilon at 1e-5 moved TransformerLM's loss 8.6e-4 and
    ReformerLM's 7.5e-3 there (8e-8 and 5e-7 in the other cases), the
    feed-forward's LayerNorm's 2.3e-4 and 1.3e-3. With n_buckets [2, 4]
    (reformer_lsh_factored), ctrax's factors all reading the first rotation
    columns moved it 4e-4, its digits combined most significant first 9e-4
    (and 177 and 152 of 240 buckets differed);
  - with LSH, the buckets of the gradient's forward: every one exact (a
    near tie, where float32 and float64 may pick apart, is counted and
    allowed by lsh_reference.check_buckets; none occurs);
  - the gradient: every weight tensor, at 3 elements drawn here, against
    float64 central differences of the reference (eps 1e-6), within 1e-4 of
    the norm over the sampled elements (3e-7 measured with the standard
    trainer; 8e-6 with the memory-efficient one, whose backward recovers
    each layer's input by a float32 subtraction from its output: layer 0's
    inputs, ~3e-3 against outputs ~1, carry most of it; its reconstruction
    off by 0.1% gave 0.2, its recomputation hashing anew 3e-2);
  - a training step at dropout 0.1 (transformer, reformer): its loss within
    1e-6 relative and its gradient within 1e-4 (central differences with
    the masks held) of the reference's with ctrax's masks (1.6e-8 and
    1.4e-7 TransformerLM, 5.8e-8 and 7.0e-7 ReformerLM measured); every
    mask used where Trax drops, none missing, and the kept fraction within
    5 standard deviations of 1 - rate. Mutants: Dropout's 1 / (1 - rate) at
    1 moved the loss 4.6e-3 (TransformerLM) and 5.1e-2 (ReformerLM);
    attention dropout off 2.0e-4 and 1.8e-2, unscaled 5.0e-3
    (TransformerLM); SelfAttention's output dropout off 2.1e-2, the
    position table's 2.1e-3; a dropout moved (to the residual's shortcut,
    or after FastGelu) leaves its site without a mask; here, the attention
    residual's mask on the attention's input 2.5e-4, the feed-forward's
    first after FastGelu 4.3e-4.
    With LSHSelfAttention (reformer_lsh_r1; reformer_lsh_r1_chunked, also
    chunked feed-forward and loss tail, memory-efficient trainer): one hash
    round, since with two a query whose every round sees only its own
    copies (causal position 0) has round logsumexps near -1e5, which
    float32 holds to 2^-8, and with dropout its rounds' outputs differ, so
    their weights count: half that spacing moved the loss 3.9e-5 (4.4e-5
    chunked), ctrax's was 1.0e-6 (2.4e-5) from this reference. Measured
    4.0e-8 / 7.6e-8 and 1.5e-8 / 3.5e-5 (the memory-efficient backward's
    reconstruction); the buckets of the training step's forward exact.
    Mutants: LSH attention dropout skipped 1.2e-2 / 4.9e-2, unscaled
    2.6e-3 / 4.5e-3, its output dropout off 2.2e-2 / 2.2e-2, the axial
    positions' dropout off 1.5e-2 / 2.5e-2 (train loss); one key for every
    feed-forward chunk, or for every chunk of the loss tail, leaves a
    mask of 6 rows for 30; the reversible recomputation on another key
    draws a second key where there is one.
One line per case: "ok CASE ..." or "FAIL CASE ...".
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lsh_reference as lsh  # noqa: E402
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


def ints(text):
    return [int(v) for v in text.split(",")]


def axial_positions(w, p, meta, b, t, ctx):
    # position_encodings.py AxialPositionalEncoding: each weight (1,
    # 1..n_k..1, d_k) broadcast to (B, n_0, .., n_{K-1}, d_k), concatenated
    # in axis order, reshaped to (B, T, D) (row-major: position t has digits
    # i_k). In training emb * keep / keep_prob first, the noise of shape
    # (B, n_0, .., D) with ReformerLM's dropout_broadcast_dims (1..K) set to
    # 1: one (B, 1, .., 1, D) mask, per example and channel ("<p>", (B,
    # D)). (B, T, D).
    shape, d_embs = ints(meta["pos_axial_shape"]), ints(meta["pos_d_axial_embs"])
    if int(np.prod(shape)) != t:
        raise ValueError(f"pos_axial_shape {shape} does not multiply to T={t}")
    axes = []
    for k, (n, d) in enumerate(zip(shape, d_embs)):
        e = w[f"{p}/axis_{k}"].reshape([1] + [n if j == k else 1 for j in range(len(shape))] + [d])
        axes.append(np.broadcast_to(e, (b, *shape, d)))
    emb = np.concatenate(axes, axis=-1)
    mult = drop_multiplier(p, ctx, (b, emb.shape[-1]))
    if mult is not None:
        emb = emb * mult.reshape((b,) + (1,) * len(shape) + (emb.shape[-1],))
    return emb.reshape(b, t, emb.shape[-1])


def drop_multiplier(site, ctx, shape):
    # In training, keep / (1 - rate) (Trax's keep / keep_prob) where keep is
    # the mask ctrax drew at this site ("mask/<layer path>", 0 or 1), which
    # must be of shape; None in eval mode (ctx without "masks"). The site's
    # place in the model and the scale are this file's, only which elements
    # drop is ctrax's.
    masks = ctx.get("masks")
    if masks is None:
        return None
    if site not in masks:
        raise LookupError(f"ctrax drew no dropout mask at {site}")
    keep = masks[site]
    if keep.shape != shape:
        raise LookupError(f"{site}: ctrax's mask {keep.shape}, here {shape}")
    ctx["used"].add(site)
    return keep / (1.0 - ctx["rate"])


def dropout(x, site, ctx, shape=None):
    # core.py Dropout in training mode: x * keep / (1 - rate), keep of x's
    # shape, or of shape when given (a mask broadcast over x's leading axes,
    # as Trax's broadcast dropouts); the identity in eval mode.
    mult = drop_multiplier(site, ctx, x.shape if shape is None else shape)
    return x if mult is None else x * mult


def shift_right_embed(w, model, meta, tokens, ctx):
    # ShiftRight(1): pad one 0 on the left of axis 1, drop the last; then
    # Embedding (weights[ids]), Dropout, and PositionalEncoding (x +
    # table[:T]; in training ReformerLM's drops whole channels of the table,
    # position_encodings.py PositionalEncoding with dropout_broadcast_dims
    # (-2,); TransformerLM's has no dropout) or, pos_type 'axial',
    # AxialPositionalEncoding.
    shifted = np.concatenate([np.zeros_like(tokens[:, :1]), tokens[:, :-1]], axis=1)
    x = dropout(w[model + "/Embedding[1]/embedding"][shifted], model + "/Dropout[2]", ctx)
    if meta.get("pos_type") == "axial":
        return x + axial_positions(w, model + "/AxialPositionalEncoding[3]", meta, *tokens.shape, ctx)
    pe = w[model + "/PositionalEncoding[3]/embedding"][: tokens.shape[1]]
    if model == "ReformerLM":
        pe = dropout(pe, model + "/PositionalEncoding[3]", ctx, pe.shape[-1:])
    return x + pe


def causal_attention(x, w, p, n_heads, ctx):
    # attention.py CausalAttention: Dense q, k, v (d_model each), split into
    # heads (B, T, H, d) -> (B, H, T, d) (SplitIntoHeads), DotProductAttention
    # with the causal mask (dots / sqrt(d_head), -1e9 where key > query,
    # softmax, in training Dropout on those probabilities (B, H, T, T) before
    # they weight the values), merged back, then the output Dense.
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
    dots = dropout(dots, p + "/DotProductCausalAttention[1]", ctx)
    o = (dots @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    return dense(o, w, p + "/Dense[2]")


def self_attention(x, w, p, n_heads, ctx):
    # efficient_attention.py SelfAttention, chunk_len None, causal, no bias:
    # per head q = x Wq, k = x Wk / sqrt(d_qk) (attend), v = x Wv; dots q.k,
    # minus 1e9 where query position < key position; softmax; in training
    # attend's dropout on those probabilities, one (T, T) mask for every
    # example and head ("<p>/attention"); o Wo, summed over heads; in
    # training apply_broadcasted_dropout on the output's channels
    # ("<p>/output", (D,)).
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
        dots = dropout(dots, p + "/attention", ctx, (t, t))
        y = y + (dots @ v) @ w[f"{p}/Wo[{h}]"]
    return dropout(y, p + "/output", ctx, y.shape[-1:])


def lsh_self_attention(x, w, p, meta, lsh_ctx):
    # efficient_attention.py LSHSelfAttention, causal (ReformerLM's), per (b,
    # h) with tests/lsh_reference.py (REFORMER.md section 2): q = x Wq
    # (shared QK), v = x Wv, buckets of q under the rotation of (b, h), (B H,
    # dk, R, n_rot)[b H + h]; attend; y = sum_h o Wo. In training (its
    # forward_unbatched: attend_rng, output_rng = split(rng), one rng for
    # every example and head): attend's dropout on each sorted chunk's
    # probabilities, one (chunk_len, W) mask ("<p>/attention"), and
    # apply_broadcasted_dropout on each head's o Wo, one (D,) mask
    # ("<p>/output").
    # lsh_ctx: "rot" by layer path; "fixed" None (hash: each (p, b, h)'s
    # (buckets, near ties, NB) go to "seen") or a dict of buckets to reuse.
    b_, t, _ = x.shape
    n_heads = int(meta["n_heads"])
    P = {"n_hashes": int(meta["n_hashes"]), "chunk_len": int(meta["chunk_len"]), "causal": 1,
         "n_chunks_before": int(meta["n_chunks_before"]), "n_chunks_after": int(meta["n_chunks_after"])}
    factors = lsh.bucket_factors(meta["n_buckets"], t, P["chunk_len"])
    rot = lsh_ctx["rot"][p]
    if rot.shape[-1] != sum(f // 2 for f in factors):
        raise ValueError(f"{p}: rotations of width {rot.shape[-1]}, factors {factors}")
    valid = np.ones(t, bool)
    m = P["chunk_len"]
    drop = drop_multiplier(p + "/attention", lsh_ctx, (m, m * (1 + P["n_chunks_before"] + P["n_chunks_after"])))
    y = np.zeros(x.shape)
    for b in range(b_):
        for h in range(n_heads):
            q, v = x[b] @ w[f"{p}/Wq[{h}]"], x[b] @ w[f"{p}/Wv[{h}]"]
            if lsh_ctx["fixed"] is None:
                hashed = lsh.hash_buckets(q, rot[b * n_heads + h], factors, None)
                lsh_ctx["seen"][p, b, h] = hashed + (factors,)
                buckets = hashed[0]
            else:
                buckets = lsh_ctx["fixed"][p, b, h][0]
            o, _ = lsh.attend(q, v, buckets, valid, P, drop)
            y[b] += dropout(o @ w[f"{p}/Wo[{h}]"], p + "/output", lsh_ctx, x.shape[-1:])
    return y


def transformer_lm(w, meta, tokens, ctx):
    # transformer.py TransformerLM / _DecoderBlock / _FeedForwardBlock, the
    # Dropouts at Trax's places: after the embedding, on the attention
    # probabilities, after the attention (in the residual branch), after
    # the Relu and after the second Dense.
    m = "TransformerLM"
    x = shift_right_embed(w, m, meta, tokens, ctx)
    n_layers = int(meta["n_layers"])
    for i in range(n_layers):
        blk = f"{m}/DecoderBlock[{4 + i}]"
        a = f"{blk}/Residual[0]/Branch[0]/Parallel[1]/Serial[1]"
        y = layer_norm(x, w[a + "/LayerNorm[0]/scale"], w[a + "/LayerNorm[0]/bias"])
        y = causal_attention(y, w, a + "/CausalAttention[1]", int(meta["n_heads"]), ctx)
        x = x + dropout(y, a + "/Dropout[2]", ctx)
        f = f"{blk}/Residual[1]/Branch[0]/Parallel[1]/Serial[1]"
        y = layer_norm(x, w[f + "/LayerNorm[0]/scale"], w[f + "/LayerNorm[0]/bias"])
        y = dropout(relu(dense(y, w, f + "/Dense[1]")), f + "/Dropout[3]", ctx)
        x = x + dropout(dense(y, w, f + "/Dense[4]"), f + "/Dropout[5]", ctx)
    k = 4 + n_layers
    x = layer_norm(x, w[f"{m}/LayerNorm[{k}]/scale"], w[f"{m}/LayerNorm[{k}]/bias"])
    return dense(x, w, f"{m}/Dense[{k + 1}]")


def reformer_lm(w, meta, tokens, lsh_ctx):
    # reformer.py ReformerLM, its DecoderBlock as REFORMER.md section 1 reads it.
    m = "ReformerLM"
    x1 = x2 = shift_right_embed(w, m, meta, tokens, lsh_ctx)
    n_layers = int(meta["n_layers"])
    lsh_type = meta.get("attention_type") == "LSHSelfAttention"
    for i in range(n_layers):
        a = f"{m}/ReversibleSerial[5]/ReversibleHalfResidualAttn[{4 * i}]/Serial[0]"
        y = layer_norm(x2, w[a + "/LayerNorm[0]/scale"], w[a + "/LayerNorm[0]/bias"])
        if lsh_type:
            x1 = x1 + lsh_self_attention(y, w, a + "/LSHSelfAttention[1]", meta, lsh_ctx)
        else:
            x1 = x1 + self_attention(y, w, a + "/SelfAttention[1]", int(meta["n_heads"]), lsh_ctx)
        # Chunked (Trax's BatchLeadingAxes(Chunk(FF))): the same function
        # of each row, its layers one level down.
        f = f"{m}/ReversibleSerial[5]/ReversibleHalfResidualFF[{4 * i + 2}]/Serial[0]"
        if int(meta.get("ff_chunk_size", "0")) > 0:
            f += "/Chunk[0]/Serial[0]"
        y = layer_norm(x1, w[f + "/LayerNorm[0]/scale"], w[f + "/LayerNorm[0]/bias"])
        y = fast_gelu(dropout(dense(y, w, f + "/Dense[1]"), f + "/Dropout[2]", lsh_ctx))
        x2 = x2 + dropout(dense(y, w, f + "/Dense[4]"), f + "/Dropout[5]", lsh_ctx)
    x = np.concatenate([x1, x2], axis=-1)
    x = layer_norm(x, w[f"{m}/LayerNorm[7]/scale"], w[f"{m}/LayerNorm[7]/bias"])
    return dense(dropout(x, f"{m}/Dropout[8]", lsh_ctx), w, f"{m}/Dense[9]")


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
    # The weights by the gradient's names (the checkpoint also holds state).
    names = sorted(k[len("grad/"):] for k in t if k.startswith("grad/"))

    def rotations(forward):
        prefix = f"rot_{forward}/"
        return {k[len(prefix):]: a[2].astype(np.float64) for k, a in t.items() if k.startswith(prefix)}

    def loss(w, forward, weights=weights, fixed=None, seen=None, masks=None, used=None):
        ctx = {"rot": rotations(forward), "fixed": fixed, "seen": seen if seen is not None else {}}
        if masks is not None:
            ctx.update(masks=masks, used=used if used is not None else set(), rate=float(meta["dropout"]))
        return weighted_ce(model(w, meta, tokens, ctx), targets, weights)

    ref = loss(w, "eval")
    got = float(t["loss_eval"][2][0])
    loss_rel = abs(got - ref) / abs(ref)
    print(f"{case}: eval loss ctrax {got:.8f}, reference {ref:.8f}, rel diff {loss_rel:.2e} (tol {LOSS_TOL:g})")
    ref1 = loss(w, "evaluator", np.ones_like(weights))
    got1 = float(t["loss_evaluator"][2][0])
    loss_rel = max(loss_rel, abs(got1 - ref1) / abs(ref1))
    print(f"{case}: evaluator at weights 1: ctrax {got1:.8f}, reference {ref1:.8f}, "
          f"rel diff {abs(got1 - ref1) / abs(ref1):.2e}")

    def check_buckets(seen, what, forward):
        # LSH: the buckets the reference hashed (seen) against the ones
        # ctrax's training forward stored ("<what>/<layer path>"); the count
        # that differ.
        n_ok = n_tie = n_bad = n_all = 0
        for (p, b, h), (buckets, near, nb, factors) in sorted(seen.items()):
            got_b = t[f"{what}/{p}"][2][b * int(meta["n_heads"]) + h]
            ok, tie, bad = lsh.check_buckets(got_b, buckets, near, factors, nb)
            n_ok, n_tie, n_bad, n_all = n_ok + ok, n_tie + tie, n_bad + bad, n_all + buckets.size
        if seen:
            print(f"{case}: {forward}: buckets {n_ok}/{n_all} exact, {n_tie} near ties, {n_bad} differ "
                  f"(factors {factors}, {len({k[0] for k in seen})} layers)")
        return n_bad

    # LSH: the gradient's forward hashed at these weights, its buckets held
    # for the central differences and checked against ctrax's.
    seen = {}
    loss(w, "grad", seen=seen)
    n_bad = check_buckets(seen, "buckets", "gradient's forward")

    def grad_diff(what, f):
        # ctrax's gradient "<what>/<weight>" against central differences of
        # f(w) at 3 elements of every weight: |diff| / |grad|.
        rng = np.random.default_rng(0)
        dd = nn = 0.0
        n = 0
        for name in names:
            ga = t[f"{what}/{name}"][2].ravel().astype(np.float64)
            flat = w[name].reshape(-1)
            for k in rng.choice(flat.size, size=min(3, flat.size), replace=False):
                saved = flat[k]
                flat[k] = saved + GRAD_EPS
                lp = f(w)
                flat[k] = saved - GRAD_EPS
                lm = f(w)
                flat[k] = saved
                g = (lp - lm) / (2 * GRAD_EPS)
                dd += (ga[k] - g) ** 2
                nn += g * g
                n += 1
        return np.sqrt(dd) / max(np.sqrt(nn), 1e-12), np.sqrt(nn), n

    grad_rel, gnorm, n = grad_diff("grad", lambda w: loss(w, "grad", fixed=seen))
    print(f"{case}: gradient at {n} elements of {len(names)} weights: |ctrax - central differences| / |grad| "
          f"{grad_rel:.2e} (|grad| {gnorm:.3e}, tol {GRAD_TOL:g})")
    good = loss_rel < LOSS_TOL and grad_rel < GRAD_TOL and n_bad == 0
    train = ""
    if "loss_train" in t:
        ok_train, train = check_train(case, t, meta, w, loss, grad_diff, check_buckets)
        good = good and ok_train
    print(f"{'ok' if good else 'FAIL'} {case} loss rel {loss_rel:.2e} grad rel {grad_rel:.2e}"
          + (f" buckets differing {n_bad}" if seen else "") + train)
    return good


def check_train(case, t, meta, w, loss, grad_diff, check_buckets):
    """A training step at dropout meta["dropout"] with the masks ctrax drew
    ("mask/<layer path>"): its loss ("loss_train") and gradient
    ("grad_train/<weight>") against the reference's forward with those
    masks at Trax's dropout sites. Every mask must be used, and about
    1 - rate of their elements kept. With LSH, that forward hashes with the
    rotations of ctrax's ("rot_train/<layer path>"), its buckets checked
    against those ctrax's step stored ("buckets_train/...") and held for
    the central differences. Returns (passed, summary)."""
    masks = {k[len("mask/"):]: a[2].astype(np.float64) for k, a in t.items() if k.startswith("mask/")}
    rate = float(meta["dropout"])
    kept = sum(m.sum() for m in masks.values())
    total = sum(m.size for m in masks.values())
    # Binomial: 5 standard deviations of the kept count.
    sigma = np.sqrt(total * rate * (1 - rate))
    frac_ok = total > 0 and abs(kept - total * (1 - rate)) < 5 * sigma
    print(f"{case}: training step at dropout {rate:g}: {len(masks)} masks of ctrax's, {int(kept)}/{total} kept "
          f"({kept / max(total, 1):.4f}, expected {1 - rate:g} +- {5 * sigma / max(total, 1):.4f})")
    used, seen = set(), {}
    try:
        ref = loss(w, "train", masks=masks, used=used, seen=seen)
    except LookupError as e:
        print(f"{case}: training step: {e}")
        return False, " train: mask missing"
    n_bad = check_buckets(seen, "buckets_train", "training step's forward")
    unused = sorted(set(masks) - used)
    if unused:
        print(f"{case}: training step: ctrax drew masks where Trax has no dropout: {unused}")
    got = float(t["loss_train"][2][0])
    rel = abs(got - ref) / abs(ref)
    print(f"{case}: training loss ctrax {got:.8f}, reference {ref:.8f}, rel diff {rel:.2e} (tol {LOSS_TOL:g}; "
          f"the eval loss {float(t['loss_eval'][2][0]):.8f})")
    grad_rel, gnorm, n = grad_diff("grad_train", lambda w: loss(w, "train", masks=masks, fixed=seen))
    print(f"{case}: training gradient at {n} elements: |ctrax - central differences| / |grad| {grad_rel:.2e} "
          f"(|grad| {gnorm:.3e}, tol {GRAD_TOL:g})")
    good = frac_ok and not unused and rel < LOSS_TOL and grad_rel < GRAD_TOL and n_bad == 0
    return good, f" train loss rel {rel:.2e} train grad rel {grad_rel:.2e}" + (
        f" train buckets differing {n_bad}" if seen else "")


def main():
    results = [check(p) for p in sys.argv[1:]]
    sys.exit(0 if results and all(results) else 1)


if __name__ == "__main__":
    main()
