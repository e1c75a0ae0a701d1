// ctrax sample: text from a byte-level language model checkpoint.
//
// The model comes from the config saved in the checkpoint (train.model), its
// weights from the checkpoint by name. Generation is autoregressive with the
// whole context run again for every new byte (no key/value cache: the models
// here are small and the window short). Trax's LMs shift right inside the
// model, so to predict token t the input holds tokens 0..t-1 and a
// placeholder at t, and the logits at position t are the prediction.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "core/fs.h"
#include "ctrax/config/config.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/train/trainer.h"

typedef struct sample_opts {
    const char *path, *name;
    const char *prompt;  // prompt_len bytes, any byte values (--prompt-file)
    size_t prompt_len;
    const char *prompt_file;
    int64_t length;
    double temperature;
    int64_t top_k;
    int64_t seed;
    int64_t context;  // 0: the model's max_len
    bool raw;
} sample_opts;

static sample_opts sample_defaults(void) {
    return (sample_opts){.prompt = "", .length = 200, .temperature = 1.0, .top_k = 0, .seed = 0};
}

// The longest --prompt-file: the bytes --length may make.
#define SAMPLE_PROMPT_FILE_MAX ((size_t)1 << 24)

// The context of a model with no max_len (an RNNLM), unless --context says.
#define CT_SAMPLE_DEFAULT_CONTEXT 1024

static void usage(FILE *f) {
    sample_opts d = sample_defaults();
    fprintf(f,
            "usage: ctrax sample OUTPUT_DIR [options]\n"
            "\n"
            "Generates text with a byte-level language model (a TransformerLM or\n"
            "ReformerLM trained on text): the model and its config come from the newest\n"
            "checkpoint of OUTPUT_DIR (or from a checkpoint directory given instead).\n"
            "Prints the prompt and the continuation on stdout, followed by a newline;\n"
            "bytes that are not printable text are shown as '?'. The same seed gives\n"
            "the same text.\n"
            "\n"
            "options (defaults in brackets):\n"
            "  --prompt TEXT       text to continue [none]\n"
            "  --prompt-file FILE  the bytes of FILE to continue, as they are (any byte,\n"
            "                      0 included), instead of --prompt; at most 16 MiB\n"
            "  --length N          bytes to generate [%lld]\n"
            "  --temperature T     divides the logits; 0 always takes the likeliest byte [%g]\n"
            "  --top-k K           sample among the K likeliest bytes only; 0: all [%lld]\n"
            "  --seed S            random seed [%lld]\n"
            "  --context N         the model's window: the byte it predicts and the N-1\n"
            "                      before it; earlier ones slide out [the model's max_len;\n"
            "                      %d for a model with none]\n"
            "  --name NAME         use checkpoint NAME of OUTPUT_DIR instead of the newest\n"
            "  --raw               write the bytes as they are, with no newline at the end\n"
            "  --threads N         threads for ctrax's loops and the GEMM together\n"
            "  -h, --help          show this help\n",
            (long long)d.length, d.temperature, (long long)d.top_k, (long long)d.seed, CT_SAMPLE_DEFAULT_CONTEXT);
}

// ---- output -----------------------------------------------------------------------

// Writes bytes as text, one output byte per input byte: printable ASCII, tab
// and newline as they are, valid UTF-8 sequences as they are, anything else
// as '?'. A multi-byte sequence is held until it is complete.
typedef struct text_out {
    FILE *f;
    bool raw;
    unsigned char pending[4];
    int n_pending, need;
} text_out;

static void out_flush_pending(text_out *o) {
    for (int i = 0; i < o->n_pending; i++) fputc('?', o->f);
    o->n_pending = 0;
}

static void out_byte(text_out *o, unsigned char c) {
    if (o->raw) {
        fputc(c, o->f);
        return;
    }
    if (o->n_pending > 0) {
        // RFC 3629: after E0, ED, F0 and F4 the second byte has a narrower
        // range (no overlong forms, surrogates or code points past U+10FFFF).
        unsigned char lead = o->pending[0], lo = 0x80, hi = 0xbf;
        if (o->n_pending == 1) {
            if (lead == 0xe0) lo = 0xa0;
            else if (lead == 0xed) hi = 0x9f;
            else if (lead == 0xf0) lo = 0x90;
            else if (lead == 0xf4) hi = 0x8f;
        }
        if (c >= lo && c <= hi) {
            o->pending[o->n_pending++] = c;
            if (o->n_pending == o->need) {
                fwrite(o->pending, 1, (size_t)o->n_pending, o->f);
                o->n_pending = 0;
            }
            return;
        }
        out_flush_pending(o);
    }
    if (c == '\n' || c == '\t' || (c >= 0x20 && c < 0x7f)) fputc(c, o->f);
    else if (c >= 0xc2 && c <= 0xf4) {
        o->pending[0] = c;
        o->n_pending = 1;
        o->need = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    } else fputc('?', o->f);
}

// ---- sampling ----------------------------------------------------------------------

typedef struct scored {
    double logit;
    int id;
} scored;

// Likeliest first; equal logits by id, so the order is total.
static int cmp_scored(const void *a, const void *b) {
    const scored *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

// The next token from logits (V of them): greedy at temperature 0, else a
// draw with u in [0, 1) from softmax(logits / temperature) over the top_k
// likeliest (all if top_k is 0). A non-finite logit (NaN, or an overflow to
// inf) is never drawn; -1 when no logit is finite: there is nothing to draw
// from, and byte 0 would pass for the model's choice. buf holds V items.
static int pick(const float *logits, int V, double temperature, int64_t top_k, float u, scored *buf) {
    for (int i = 0; i < V; i++) buf[i] = (scored){isfinite(logits[i]) ? logits[i] : -INFINITY, i};
    qsort(buf, (size_t)V, sizeof *buf, cmp_scored);
    if (!isfinite(buf[0].logit)) return -1;
    if (temperature == 0) return buf[0].id;
    int k = top_k > 0 && top_k < V ? (int)top_k : V;
    double sum = 0;
    for (int i = 0; i < k; i++) sum += exp((buf[i].logit - buf[0].logit) / temperature);
    double target = (double)u * sum, acc = 0;
    for (int i = 0; i < k; i++) {
        acc += exp((buf[i].logit - buf[0].logit) / temperature);
        if (target < acc) return buf[i].id;
    }
    return buf[k - 1].id;  // u * sum rounded up to sum
}

// ---- the command ---------------------------------------------------------------------

static int fail(const char *what, const ct_error *err) {
    fprintf(stderr, "ctrax sample: %s%s%s\n", what, err ? ": " : "", err ? err->msg : "");
    return CTRAX_EXIT_ERROR;
}

// Prints the prompt, then o->length bytes drawn from the model on net, one
// at a time from the last W - 1 bytes (P of them the prompt's). Every
// forward is W long, the bytes so far at its start and zeros after them:
// chunked attention takes only multiples of its chunk length, and W is one
// the model was built for; the zeros come after the predicted position, so
// causal attention does not see them (LSH attention's sorted chunks may
// shift).
static int generate(const sample_opts *o, const ct_net *net, int64_t P, int64_t W, int V) {
    int64_t total = P + o->length;
    int32_t *tokens = malloc((size_t)(total + 1) * sizeof *tokens), *window = malloc((size_t)W * sizeof *window);
    scored *scratch = malloc((size_t)V * sizeof *scratch);
    ct_arena arena;
    ct_ctx ctx;
    ct_error err = {0};
    int rc = CTRAX_EXIT_ERROR;
    if (!tokens || !window || !scratch) {
        fprintf(stderr, "ctrax sample: out of memory for %lld tokens\n", (long long)total);
        goto done;
    }
    for (int64_t i = 0; i < P; i++) tokens[i] = (unsigned char)o->prompt[i];
    ct_arena_init(&arena, net->dev);
    ct_ctx_init(&ctx, &arena);
    ct_net_bind(net, &ctx, false);
    ctx.record = false;
    text_out out = {.f = stdout, .raw = o->raw};
    for (int64_t i = 0; i < P; i++) out_byte(&out, (unsigned char)o->prompt[i]);
    fflush(stdout);
    ct_key key = ct_key_from_seed((uint64_t)o->seed);
    bool ok = true;
    // A write that failed (a full disk) ends the generation: the rest would be lost.
    for (int64_t i = 0; i < o->length && ok && !ferror(stdout); i++) {
        int64_t t = P + i;                  // tokens so far; predict token t
        int64_t L = t + 1 <= W ? t + 1 : W;  // the last L - 1 of them and a placeholder
        memcpy(window, tokens + (t + 1 - L), (size_t)(L - 1) * sizeof *window);
        for (int64_t j = L - 1; j < W; j++) window[j] = 0;
        ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 1, W, window), logits;
        if (ct_layer_forward(net->root, &ctx, &in, &logits, ct_key_from_seed(0), &err) != CT_OK) {
            fail("running the model", &err);
            ok = false;
            break;
        }
        float u;
        ct_random_uniform(ct_key_fold_in(key, (uint32_t)i), &u, 1, 0.0f, 1.0f);
        tokens[t] = pick(ct_f32(&logits) + (size_t)(L - 1) * (size_t)V, V, o->temperature, o->top_k, u, scratch);
        ct_arena_reset(&arena);
        if (tokens[t] < 0) {
            fprintf(stderr, "\nctrax sample: the model's %d logits for byte %lld are all NaN or infinite: nothing to draw from\n",
                    V, (long long)t);
            ok = false;
            break;
        }
        out_byte(&out, (unsigned char)tokens[t]);
        fflush(stdout);
    }
    ct_ctx_free(&ctx);
    ct_arena_free(&arena);
    if (ok) {
        out_flush_pending(&out);
        if (!o->raw) fputc('\n', stdout);
        rc = ctrax_flush_stdout("sample");
    }
done:
    free(tokens);
    free(window);
    free(scratch);
    return rc;
}

// The model of the checkpoint's config as its evals built it (*model_name:
// "eval/<model>" with eval/ bindings, in name_buf), and the context to
// sample with: --context, or the model's max_len (0: none), checked against it.
static int build_model(ct_config *cfg, const ct_checkpoint *c, const char *dir, const sample_opts *o, ct_layer **model,
                       const char **model_name, char *name_buf, size_t name_cap, int64_t *context) {
    ct_error err = {0};
    if (ct_config_get_reference(cfg, "train", "model", NULL, model_name, &err) != CT_OK)
        return fail("the checkpoint's config", &err);
    if (!*model_name) {
        fputs("ctrax sample: the config of ", stderr);
        ctrax_put_checkpoint(stderr, dir, c);
        fputs(" binds no train.model\n", stderr);
        return CTRAX_EXIT_ERROR;
    }
    *model_name = ctrax_eval_model_name(cfg, *model_name, name_buf, name_cap);
    if (ct_config_build_model(cfg, *model_name, model, &err) != CT_OK) return fail("building the model", &err);
    // The model's max_len, if it has one (an MLP has none: the query fails).
    int64_t max_len = 0;
    if (ct_config_get_int(cfg, *model_name, "max_len", 0, &max_len, &err) != CT_OK) max_len = 0;
    // A model with no max_len (an RNNLM) would see every byte so far, each
    // new byte running all of them again: quadratic in --length.
    *context = o->context > 0 ? o->context : max_len > 0 ? max_len : CT_SAMPLE_DEFAULT_CONTEXT;
    if (max_len > 0 && *context > max_len) {
        fprintf(stderr, "ctrax sample: --context %lld is longer than the model's max_len %lld\n", (long long)*context,
                (long long)max_len);
        return CTRAX_EXIT_ERROR;
    }
    return CTRAX_EXIT_OK;
}

static int sample(const sample_opts *o) {
    ct_checkpoint *c = NULL;
    char *dir = NULL;
    ct_config *cfg = NULL;
    ct_layer *model = NULL;
    ct_net net = {0};
    bool have_net = false;
    ct_device dev = ct_device_cpu();
    ct_error err = {0};
    int rc = ctrax_open_checkpoint("sample", o->path, o->name, &c, &dir);
    if (rc) return rc;
    rc = CTRAX_EXIT_ERROR;

    // The model, from the config it was trained with.
    if (!(cfg = ctrax_checkpoint_parse_config("sample", c, dir))) goto done;
    const char *model_name = NULL;
    char name_buf[300];
    int64_t context = 0;
    if (build_model(cfg, c, dir, o, &model, &model_name, name_buf, sizeof name_buf, &context) != CTRAX_EXIT_OK)
        goto done;

    // A net for inputs (1, W): W the longest input generation needs, at most the context.
    int64_t P = (int64_t)o->prompt_len, total = P + o->length;
    int64_t W = total > 0 ? total : 1;
    if (context > 0 && W > context) W = context;
    ct_tensor in_sig = ct_tensor_2d(CT_DTYPE_I32, 1, W, NULL);
    if (ct_net_init(&net, model, &in_sig, 1, ct_key_from_seed(0), &dev, &err) != CT_OK) {
        // Chunked attention takes only multiple lengths: the full context
        // instead, which the model was built for.
        ct_error first = err;
        in_sig = ct_tensor_2d(CT_DTYPE_I32, 1, context, NULL);
        if (context <= W || ct_net_init(&net, model, &in_sig, 1, ct_key_from_seed(0), &dev, &err) != CT_OK) {
            fail("the model does not take a (1, T) int32 input", &first);
            goto done;
        }
        W = context;
    }
    have_net = true;
    const ct_tensor *os = &net.out_sigs[0];
    if (net.n_out != 1 || os->ndim != 3 || os->shape[0] != 1 || os->shape[1] != W || os->dtype != CT_DTYPE_F32) {
        char s[CT_SIG_STR_MAX];
        fprintf(stderr, "ctrax sample: %s is not a language model: for input (1,%lld) it gives %s\n", model_name,
                (long long)W, ct_tensor_sig_str(os, s, sizeof s));
        goto done;
    }
    int V = (int)os->shape[2];
    if (V > 256) {
        fprintf(stderr, "ctrax sample: %s has a vocabulary of %d tokens; byte-level text needs at most 256\n",
                model_name, V);
        goto done;
    }

    // Its weights and state, every one of them, from the checkpoint (LSH's
    // stored buckets, shaped by the training batch, start fresh).
    if (ct_net_load_checkpoint(&net, c, CT_LOAD_STRICT, &err) != CT_OK) {
        fail("loading the weights", &err);
        goto done;
    }
    for (int64_t i = 0; i < P; i++) {
        unsigned char b = (unsigned char)o->prompt[i];
        if (b >= V) {
            fprintf(stderr, "ctrax sample: prompt byte %lld (0x%02x) is not in the model's vocabulary of %d tokens\n",
                    (long long)i, b, V);
            goto done;
        }
    }
    char count[32];
    fprintf(stderr, "sampling %lld bytes from ", (long long)o->length);
    ctrax_put_checkpoint(stderr, dir, c);
    fprintf(stderr,
            " (step %lld): %s, %s weights, context %lld, temperature %g, top-k %lld, seed %lld\n",
            (long long)ct_checkpoint_step(c), model_name,
            ctrax_format_count((int64_t)net.n_weights, count, sizeof count), (long long)W, o->temperature,
            (long long)o->top_k, (long long)o->seed);

    rc = generate(o, &net, P, W, V);
done:
    if (have_net) ct_net_free(&net);
    ct_layer_free(model);
    ct_config_free(cfg);
    ct_checkpoint_close(c);
    free(dir);
    return rc;
}

int ctrax_cmd_sample(int argc, char **argv) {
    sample_opts o = sample_defaults();
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return ctrax_flush_stdout("sample");
        }
        if (!strcmp(a, "--raw")) {
            o.raw = true;
            continue;
        }
        static const char *const value_opts[] = {"--prompt", "--prompt-file", "--name",    "--length",
                                                 "--temperature", "--top-k", "--seed", "--context"};
        const char *opt = NULL;
        int r = ctrax_opt_threads("sample", argc, argv, &i), bad = 0;
        if (r) {
            if (r < 0) return CTRAX_EXIT_USAGE;
            continue;
        }
        for (size_t k = 0; k < sizeof value_opts / sizeof *value_opts && !r; k++)
            if ((r = ctrax_opt_value("sample", argc, argv, &i, value_opts[k], &v))) opt = value_opts[k];
        if (r < 0) return CTRAX_EXIT_USAGE;
        if (r > 0) {
            if (!strcmp(opt, "--prompt")) o.prompt = v;
            else if (!strcmp(opt, "--prompt-file")) o.prompt_file = v;
            else if (!strcmp(opt, "--name")) o.name = v;
            else if (!strcmp(opt, "--length")) bad = ctrax_parse_int("sample", opt, v, 0, 1 << 24, &o.length);
            else if (!strcmp(opt, "--temperature")) bad = ctrax_parse_double("sample", opt, v, 0, 1e6, &o.temperature);
            else if (!strcmp(opt, "--top-k")) bad = ctrax_parse_int("sample", opt, v, 0, 1 << 24, &o.top_k);
            else if (!strcmp(opt, "--seed")) bad = ctrax_parse_int("sample", opt, v, 0, INT64_MAX, &o.seed);
            else bad = ctrax_parse_int("sample", opt, v, 1, 1 << 24, &o.context);
            if (bad) return CTRAX_EXIT_USAGE;
            continue;
        }
        if (a[0] == '-' && a[1]) return ctrax_usage_error("sample", "unknown option '%s'", a);
        if (o.path) return ctrax_usage_error("sample", "one output directory at a time ('%s' and '%s')", o.path, a);
        o.path = a;
    }
    if (!o.path) return ctrax_usage_error("sample", "missing OUTPUT_DIR");
    if (o.prompt_file && *o.prompt)
        return ctrax_usage_error("sample", "--prompt and --prompt-file are two prompts: give one");
    o.prompt_len = strlen(o.prompt);
    char *file_prompt = NULL;
    if (o.prompt_file) {
        ct_error err = {0};
        if (ct_fs_read_max(o.prompt_file, SAMPLE_PROMPT_FILE_MAX, &file_prompt, &o.prompt_len, &err) != CT_OK) {
            fprintf(stderr, "ctrax sample: --prompt-file: %s\n", err.msg);
            return CTRAX_EXIT_ERROR;
        }
        o.prompt = file_prompt;
    }
    int rc = sample(&o);
    free(file_prompt);
    return rc;
}
