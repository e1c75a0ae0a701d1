# Three-step references for tests/test_optim.c, computed with numpy in float32
# from Trax's formulas (trax/optimizers/*.py), independently of the C code.
# The multifactor schedule values of tests/test_schedules.c are at the end.
# Run: /usr/bin/python3 tests/optim_reference.py
import numpy as np

f = np.float32
np.set_printoptions(precision=9)

def p(name, a):
    print(name, ", ".join("%.9g" % x for x in np.asarray(a, dtype=f).ravel()))

g1 = np.array([[0.1, -0.2, 0.3], [-0.4, 0.5, 0.6], [0.7, 0.0, -0.9]], f)  # 3 steps of a (3,) weight
w1 = np.array([0.5, -1.0, 2.0], f)
rng = np.random.RandomState(0)
w2 = np.round(rng.randn(2, 3), 2).astype(f)
g2 = np.round(rng.randn(3, 2, 3), 2).astype(f)
w3 = np.round(rng.randn(2, 2, 3), 2).astype(f)
g3 = np.round(rng.randn(3, 2, 2, 3), 2).astype(f)
p("w2", w2); p("g2", g2); p("w3", w3); p("g3", g3)

def momentum(w, gs, lr, mass=f(0.9), wd=f(1e-5), nesterov=True):
    w = w.copy(); v = np.zeros_like(w)
    for g in gs:
        v = mass * v + g
        u = mass * v + g if nesterov else v
        w = (f(1) - wd) * w - f(lr) * u
    return w, v

def rmsprop(w, gs, lr, gamma=f(0.9), eps=f(1e-8)):
    w = w.copy(); a = np.ones_like(w)
    for g in gs:
        a = a * gamma + g * g * (f(1) - gamma)
        w = w - f(lr) * g / (np.sqrt(a) + eps)
    return w, a

def adafactor(w, gs, lr=f(0.05), factored=True, beta1=None, decay_exp=f(0.8), thr=f(1.0), wd=f(1e-5),
              e1=f(1e-16), e2=f(1e-3), param_scale=True):
    # Trax's current Adafactor: epsilon1 where the accumulators are read.
    w = w.copy()
    fac = factored and w.ndim >= 2
    if fac:
        vr = np.zeros(w.shape[:-1], f); vc = np.zeros(w.shape[:-2] + w.shape[-1:], f)
    else:
        v = np.zeros_like(w)
    m = np.zeros_like(w)
    for step, g in enumerate(gs, start=1):
        t = f(step) + f(1)
        decay = f(1) - t ** (-decay_exp)
        mix = f(1) - decay
        scale = f(lr) * max(np.sqrt(np.mean(w * w, dtype=f)), e2) if param_scale else f(lr)
        G = g * g
        if fac:
            vr = decay * vr + mix * np.mean(G, axis=-1)
            vc = decay * vc + mix * np.mean(G, axis=-2)
            rf = (np.mean(vr, axis=-1, keepdims=True) / (vr + e1)) ** f(0.5)
            cf = (vc + e1) ** f(-0.5)
            y = g * rf[..., :, None] * cf[..., None, :]
        else:
            v = decay * v + mix * G
            y = g * (v + e1) ** f(-0.5)
        y = y / max(f(1), np.sqrt(np.mean(y * y, dtype=f)) / thr)
        s = scale * y
        if beta1 is not None:
            m = f(beta1) * m + (f(1) - f(beta1)) * s
            s = m
        w = (f(1) - wd) * w - s
    return (w, (vr, vc) if fac else v, m)

def sm3(w, gs, lr=f(0.01), mom=f(0.9), beta2=f(1.0), wd=f(0.0), mtype="ema", graft=None):
    # graft: Trax decides it in the constructor (second_moment_averaging != 1
    # then); None: from beta2.
    w = w.copy(); m = np.zeros_like(w)
    graft = beta2 != 1 if graft is None else graft
    c = f(1) if beta2 == 1 else f(1) - beta2
    if w.ndim <= 1:
        v = [np.zeros_like(w)]; u = [np.zeros_like(w)]
    else:
        v = [np.zeros(d, f) for d in w.shape]; u = [np.zeros(d, f) for d in w.shape]
    def covers(vs):
        if w.ndim <= 1:
            return vs[0]
        acc = None
        for i, vi in enumerate(vs):
            sh = [1] * w.ndim; sh[i] = w.shape[i]
            r = vi.reshape(sh)
            acc = r if acc is None else np.minimum(acc, r)
        return acc
    def prec(g, acc):
        return g * np.where(acc > 0, f(1) / (np.sqrt(acc) + f(1e-16)), f(0))
    for g in gs:
        acc = beta2 * covers(v) + c * g * g
        pg = prec(g, acc)
        if graft:
            acc_u = covers(u) + g * g
            pgu = prec(g, acc_u)
            pg = pg * (np.linalg.norm(pgu) / (np.linalg.norm(pg) + f(1e-16)))
        pg = pg + w * wd
        if mtype == "ema":
            m = (f(1) - mom) * pg + mom * m; upd = m
        elif mtype == "heavy":
            m = pg + mom * m; upd = m
        else:
            m = pg + mom * m; upd = pg + mom * m
        w = w - lr * upd
        def maxes(a):
            if w.ndim <= 1:
                return [np.broadcast_to(a, w.shape).copy()]
            return [np.amax(a, axis=tuple(j for j in range(w.ndim) if j != i)) for i in range(w.ndim)]
        v = maxes(acc)
        if graft:
            u = maxes(acc_u)
    return w, v, m

p("momentum nesterov lr0.1", momentum(w1, g1, 0.1)[0])
p("momentum plain lr0.1", momentum(w1, g1, 0.1, nesterov=False)[0])
p("momentum velocity", momentum(w1, g1, 0.1)[1])
p("rmsprop lr0.01", rmsprop(w1, g1, 0.01)[0])
p("rmsprop acc", rmsprop(w1, g1, 0.01)[1])
w, v, _ = adafactor(w1, g1); p("adafactor 1d w", w); p("adafactor 1d v", v)
w, (vr, vc), _ = adafactor(w2, g2); p("adafactor 2d w", w); p("adafactor 2d vr", vr); p("adafactor 2d vc", vc)
w, _, m = adafactor(w2, g2, beta1=0.9); p("adafactor 2d mom w", w); p("adafactor 2d mom m", m)
w, (vr, vc), _ = adafactor(w3, g3, lr=0.5); p("adafactor 3d lr0.5 w", w); p("adafactor 3d vr", vr); p("adafactor 3d vc", vc)
w, v, _ = adafactor(w2, g2, factored=False); p("adafactor 2d unfactored w", w)
# Gradients near 1e-8, where g^2 is near epsilon1 (1e-16) and where it is added matters.
w, v, _ = adafactor(w1, g1 * f(1e-8)); p("adafactor tiny 1d w", w)
w, (vr, vc), _ = adafactor(w2, g2 * f(1e-8)); p("adafactor tiny 2d w", w)
w, v, m = sm3(w1, g1, lr=f(0.1)); p("sm3 1d w", w); p("sm3 1d v", v[0])
w, v, m = sm3(w2, g2, lr=f(0.1)); p("sm3 2d w", w); p("sm3 2d v0", v[0]); p("sm3 2d v1", v[1]); p("sm3 2d m", m)
w, v, m = sm3(w3, g3, lr=f(0.1)); p("sm3 3d w", w); p("sm3 3d v", np.concatenate(v))
w, v, m = sm3(w2, g2, lr=f(0.1), beta2=f(0.9), wd=f(0.01), mtype="heavy"); p("sm3 2d graft heavy w", w)
w, v, m = sm3(w1, g1, lr=f(0.1), beta2=f(0.9), wd=f(0.01), mtype="nesterov"); p("sm3 1d graft nesterov w", w)
# Hyperparameters at values the cases above leave at their defaults.
p("rmsprop eps0.1 lr0.01", rmsprop(w1, g1, 0.01, eps=f(0.1))[0])
p("adafactor 1d thr0.5 w", adafactor(w1, g1, thr=f(0.5))[0])
p("adafactor 2d thr0.5 w", adafactor(w2, g2, thr=f(0.5))[0])
p("adafactor 2d noscale w", adafactor(w2, g2, param_scale=False)[0])
w, _, m = adafactor(w3, g3, lr=0.5, beta1=0.9); p("adafactor 3d lr0.5 mom w", w); p("adafactor 3d mom m", m)
# Gradients near 1e-17: sqrt(acc) is near SM3's 1e-16.
p("sm3 tiny 1d w", sm3(w1, g1 * f(1e-16), lr=f(0.1))[0])
# second_moment_averaging 0.9 set after a construction at 1: no grafting.
p("sm3 2d b2 0.9 nograft w", sm3(w2, g2, lr=f(0.1), beta2=f(0.9), graft=False)[0])
gg = np.array([3.0, -4.0, 0.0, 12.0], f)
print("clip norm %.9g" % np.sqrt(np.sum(gg.astype(np.float64) ** 2)))
p("clip to 6.5", gg * (f(6.5) / f(13)))

# ---- multifactor schedule references (tests/test_schedules.c), in double ----
import math
def mf(factors, step, constant=0.1, warmup_steps=400, decay_factor=0.5, steps_per_decay=20000,
       steps_per_cycle=100000, second_constant=0.01, second_constant_step=10000, minimum=0):
    ret = 1.0
    for name in [n.strip() for n in factors.split('*')]:
        if name == 'constant': ret *= constant
        elif name == 'two_constants': ret *= constant if step < second_constant_step else second_constant
        elif name == 'linear_warmup': ret *= min(1.0, step / warmup_steps)
        elif name == 'rsqrt_decay': ret /= math.sqrt(max(step, warmup_steps))
        elif name == 'rsqrt_normalized_decay': ret *= math.sqrt(warmup_steps); ret /= math.sqrt(max(step, warmup_steps))
        elif name == 'decay_every': ret *= decay_factor ** (step // steps_per_decay)
        elif name == 'cosine_decay':
            progress = max(0.0, (step - warmup_steps) / float(steps_per_cycle))
            ret *= 0.5 * (1.0 + math.cos(math.pi * (progress % 1.0)))
        else: raise ValueError(name)
    return minimum if ret <= minimum else ret
d = 'constant * linear_warmup * rsqrt_decay'
for s in [1, 100, 399, 400, 401, 1000, 10000]: print(d, s, repr(mf(d, s)))
for s in [1, 200, 400, 800]: print('cl', s, repr(mf('constant * linear_warmup', s)))
for s in [1, 100, 400, 1600]: print('rnd', s, repr(mf('constant * rsqrt_normalized_decay', s)))
for s in [1, 19999, 20000, 40000, 65000]: print('de', s, repr(mf('constant * decay_every', s)))
for s in [1, 400, 450, 500, 599, 600, 650]: print('cos', s, repr(mf('constant*cosine_decay', s, warmup_steps=400, steps_per_cycle=200)))
for s in [1, 9999, 10000, 20000]: print('two', s, repr(mf('two_constants', s)))
for s in [1, 100, 400]: print('min', s, repr(mf('constant * linear_warmup', s, minimum=0.01)))
