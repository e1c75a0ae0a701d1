// Gin configs and the registry: parsing every value type, Trax's names,
// includes and macros, overrides, the errors (each naming file and line),
// the operative config round trip, building models, optimizers, schedules
// and inputs from a config, and a fuzz-ish pass over prefixes and mutations
// of valid configs.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "ctrax/config/config.h"
#include "ctrax/core/memory.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/models/models.h"
#include "ctrax/train/loop.h"
#include "layer_fixture.h"

// The builders return a status and write the object to *out, NULL on every
// failure: these wrappers check that rule and give the object or NULL.
#define BUILDER(kind, T)                                                       \
    static T *build_##kind(ct_config *cfg, const char *name, ct_error *err) { \
        T *out = (T *)&out; /* not NULL: a failure must clear it */            \
        ct_status st = ct_config_build_##kind(cfg, name, &out, err);           \
        CHECK((st == CT_OK) == (out != NULL));                                 \
        return st == CT_OK ? out : NULL;                                       \
    }
BUILDER(model, ct_layer)
BUILDER(layer, ct_layer)
BUILDER(optimizer, ct_optimizer)
BUILDER(schedule, ct_schedule)
#undef BUILDER

static char config_dir[4096];

// tests/configs, found from this file's path (CMake compiles it by its
// absolute path), so the test runs from any directory.
static void find_config_dir(void) {
    snprintf(config_dir, sizeof config_dir, "%s", __FILE__);
    char *slash = strrchr(config_dir, '/');
    if (slash) snprintf(slash + 1, sizeof config_dir - (size_t)(slash + 1 - config_dir), "configs");
    else snprintf(config_dir, sizeof config_dir, "tests/configs");
}

static char *config_path(const char *name) {
    static char buf[4][4200];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", config_dir, name);
    return b;
}

static char *read_all(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    fclose(f);
    s[got] = '\0';
    *len = got;
    return s;
}

// Parses text as source and expects failure with every piece of want in the
// message (NULL-terminated list).
static void expect_error(const char *source, const char *text, const char *const *want) {
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    ct_status st = ct_config_parse_text(cfg, text, strlen(text), source, &err);
    if (st == CT_OK) st = ct_config_validate(cfg, &err);
    CHECK_MSG(st != CT_OK, "no error for: %s", text);
    for (int i = 0; want[i]; i++) CHECK_MSG(strstr(err.msg, want[i]) != NULL, "'%s' not in: %s", want[i], err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
}
#define EXPECT_ERROR(source, text, ...) expect_error(source, text, (const char *const[]){__VA_ARGS__, NULL})

// ---- Every value type -------------------------------------------------------------------------

static void test_value_types(void) {
    const char *text =
        "# every kind of value, in a list a parameter of type list takes (its builder checks the items)\n"
        "MLP.layer_widths = [0x1F, -5, +7, 1_000, 1., .5, 1e-4, -2.5E+3, 0.0,\n"
        "    'single', \"double\", 'esc\\'\\n\\t\\\\\\x41', 'ab' \"cd\",  # adjacent strings join\n"
        "    True, False, None, @Adam, @trax.optimizers.SGD(), @eval/TransformerLM, %M,\n"
        "    [], (), (1,), (2), (3, 4), [[1], [2, [3]]], {'a': 1, 2: [3]}, {},\n"
        "]\n"
        "M = 'macro'\n"
        "train.steps = \\\n"
        "    12\n"
        "train.checkpoint_highest = 'it''s'\n";
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    CHECK_OK(ct_config_parse_text(cfg, text, strlen(text), "types.gin", &err), &err);
    CHECK_OK(ct_config_validate(cfg, &err), &err);
    const ct_config_value *l = NULL;
    CHECK_OK(ct_config_get_list(cfg, "MLP", "layer_widths", NULL, &l, &err), &err);
    if (!l || l->n != 28) {
        CHECK_MSG(0, "layer_widths list has %d items", l ? l->n : -1);
        ct_config_free(cfg);
        return;
    }
    const ct_config_value *it = l->items;
    CHECK(l->kind == CT_CONFIG_LIST && !strcmp(l->file, "types.gin") && l->line == 2 && l->col == 20);
    CHECK(it[0].kind == CT_CONFIG_INT && it[0].i == 31);
    CHECK(it[1].kind == CT_CONFIG_INT && it[1].i == -5);
    CHECK(it[2].kind == CT_CONFIG_INT && it[2].i == 7);
    CHECK(it[3].kind == CT_CONFIG_INT && it[3].i == 1000);
    CHECK(it[4].kind == CT_CONFIG_FLOAT && it[4].f == 1.0);
    CHECK(it[5].kind == CT_CONFIG_FLOAT && it[5].f == 0.5);
    CHECK(it[6].kind == CT_CONFIG_FLOAT && it[6].f == 1e-4);
    CHECK(it[7].kind == CT_CONFIG_FLOAT && it[7].f == -2500.0);
    CHECK(it[8].kind == CT_CONFIG_FLOAT && it[8].f == 0.0);
    CHECK(it[9].kind == CT_CONFIG_STRING && !strcmp(it[9].s, "single"));
    CHECK(it[10].kind == CT_CONFIG_STRING && !strcmp(it[10].s, "double"));
    CHECK(it[11].kind == CT_CONFIG_STRING && !strcmp(it[11].s, "esc'\n\t\\A"));
    CHECK(it[12].kind == CT_CONFIG_STRING && !strcmp(it[12].s, "abcd"));
    CHECK(it[12].line == 3);
    CHECK(it[13].kind == CT_CONFIG_BOOL && it[13].b);
    CHECK(it[14].kind == CT_CONFIG_BOOL && !it[14].b);
    CHECK(it[15].kind == CT_CONFIG_NONE);
    CHECK(it[16].kind == CT_CONFIG_REFERENCE && !strcmp(it[16].s, "Adam") && !it[16].call);
    CHECK(it[17].kind == CT_CONFIG_REFERENCE && !strcmp(it[17].s, "SGD") && it[17].call);
    CHECK(it[18].kind == CT_CONFIG_REFERENCE && !strcmp(it[18].s, "eval/TransformerLM"));
    // The macro, defined after its use, resolved, keeping where it was written.
    CHECK(it[19].kind == CT_CONFIG_STRING && !strcmp(it[19].s, "macro") && it[19].line == 7);
    CHECK(it[20].kind == CT_CONFIG_LIST && it[20].n == 0);
    CHECK(it[21].kind == CT_CONFIG_TUPLE && it[21].n == 0);
    CHECK(it[22].kind == CT_CONFIG_TUPLE && it[22].n == 1 && it[22].items[0].i == 1);
    CHECK(it[23].kind == CT_CONFIG_INT && it[23].i == 2);  // (2) is 2
    CHECK(it[24].kind == CT_CONFIG_TUPLE && it[24].n == 2 && it[24].items[1].i == 4);
    CHECK(it[25].kind == CT_CONFIG_LIST && it[25].n == 2 && it[25].items[1].items[1].items[0].i == 3);
    CHECK(it[26].kind == CT_CONFIG_DICT && it[26].n == 2 && !strcmp(it[26].items[0].s, "a") &&
          it[26].items[2].i == 2 && it[26].items[3].items[0].i == 3);
    CHECK(it[27].kind == CT_CONFIG_DICT && it[27].n == 0);
    for (int i = 0; i < l->n; i++)
        CHECK_MSG(it[i].line >= 2 && it[i].line <= (i == 19 ? 7 : 5), "item %d line %d", i, it[i].line);

    // Written back as gin, it reads the same.
    char *gin = ct_config_value_to_gin(l);
    printf("  as gin: %s\n", gin);
    CHECK(strstr(gin, "'esc\\'\\n\\t\\\\A'") != NULL);
    CHECK(strstr(gin, "(1,)") != NULL && strstr(gin, "0.0001") != NULL && strstr(gin, "-2500.0") != NULL);
    char *again_text = ct_malloc(strlen(gin) + 32);
    sprintf(again_text, "MLP.layer_widths = %s\n", gin);
    ct_config *again = ct_config_new();
    CHECK_OK(ct_config_parse_text(again, again_text, strlen(again_text), "again", &err), &err);
    const ct_config_value *l2 = NULL;
    CHECK_OK(ct_config_get_list(again, "MLP", "layer_widths", NULL, &l2, &err), &err);
    char *gin2 = l2 ? ct_config_value_to_gin(l2) : NULL;
    CHECK(gin2 && !strcmp(gin, gin2));
    ct_free(gin2);
    ct_free(gin);
    ct_free(again_text);
    ct_config_free(again);

    int64_t steps = 0;
    CHECK_OK(ct_config_get_int(cfg, "train", "steps", 1, &steps, &err), &err);
    CHECK(steps == 12);
    const char *s = NULL;
    CHECK_OK(ct_config_get_string(cfg, "train", "checkpoint_highest", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "its"));
    ct_config_free(cfg);

    // Written as Python's repr writes them: fixed notation below 1e16, an
    // exponent from there; DEL escaped as \x7f.
    {
        ct_config_value f15 = {.kind = CT_CONFIG_FLOAT, .f = 1e15}, f16 = {.kind = CT_CONFIG_FLOAT, .f = 1e16};
        ct_config_value del = {.kind = CT_CONFIG_STRING, .s = "a\x7f"};
        char *a = ct_config_value_to_gin(&f15), *b = ct_config_value_to_gin(&f16), *c = ct_config_value_to_gin(&del);
        CHECK_MSG(!strcmp(a, "1000000000000000.0") && !strcmp(b, "1e+16") && !strcmp(c, "'a\\x7f'"), "%s %s %s", a, b,
                  c);
        ct_free(a);
        ct_free(b);
        ct_free(c);
        // Up to 17 digits, as many as reading back takes: 0.1 + 0.2 written
        // with 15 would read back as 0.3, another double.
        ct_config_value f17 = {.kind = CT_CONFIG_FLOAT, .f = 0.1 + 0.2};
        char *d = ct_config_value_to_gin(&f17);
        CHECK_MSG(!strcmp(d, "0.30000000000000004"), "0.1 + 0.2 written as %s", d);
        ct_free(d);
    }

    // Ints where floats are expected become floats; integral floats where
    // ints are expected become ints.
    const char *conv = "Adam.eps = 2\ntrain.steps = 1e3\nTransformerLM.n_layers = 2.0\n";
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_text(cfg, conv, strlen(conv), "conv.gin", &err), &err);
    double eps = 1;
    CHECK_OK(ct_config_get_float(cfg, "Adam", "eps", 1.0, &eps, &err), &err);
    CHECK(eps == 2.0);
    CHECK_OK(ct_config_get_int(cfg, "train", "steps", 1, &steps, &err), &err);
    CHECK(steps == 1000);
    char *op = ct_config_operative_text(cfg);
    CHECK(strstr(op, "Adam.eps = 2.0\n") && strstr(op, "train.steps = 1000\n"));
    ct_free(op);
    ct_config_free(cfg);
}

// ---- A realistic config: includes, macros, Trax names, scopes --------------------------------

static ct_config *load_lm(ct_error *err) {
    ct_config *cfg = ct_config_new();
    CHECK_OK(ct_config_parse_file(cfg, config_path("lm.gin"), err), err);
    CHECK_OK(ct_config_validate(cfg, err), err);
    return cfg;
}

static void test_realistic(void) {
    ct_error err = {0};
    ct_config *cfg = load_lm(&err);
    int64_t i = 0;
    double f = 0;
    const char *s = NULL;
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "d_model", 512, &i, &err), &err);
    CHECK(i == 32);  // lm.gin's binding replaced base.gin's %D_MODEL
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "vocab_size", 256, &i, &err), &err);
    CHECK(i == 40);  // through %VOCAB, bound as trax.models.TransformerLM
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "n_heads", 8, &i, &err), &err);
    CHECK(i == 4);
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "max_len", 2048, &i, &err), &err);
    CHECK(i == 2048);  // unbound: the default
    CHECK_OK(ct_config_get_float(cfg, "TransformerLM", "dropout", 0.5, &f, &err), &err);
    CHECK(f == 0.1);
    CHECK_OK(ct_config_get_float(cfg, "eval/TransformerLM", "dropout", 0.5, &f, &err), &err);
    CHECK(f == 0.0);  // the scoped binding wins in its scope
    CHECK_OK(ct_config_get_int(cfg, "eval/TransformerLM", "d_model", 512, &i, &err), &err);
    CHECK(i == 32);  // and the unscoped one applies elsewhere
    CHECK_OK(ct_config_get_float(cfg, "Adam", "eps", 1e-5, &f, &err), &err);
    CHECK(f == 1e-9);

    CHECK_OK(ct_config_get_reference(cfg, "train", "model", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "TransformerLM"));
    CHECK_OK(ct_config_get_reference(cfg, "train", "optimizer", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "Adam"));
    CHECK_OK(ct_config_get_reference(cfg, "train", "loss_fn", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "WeightedCategoryCrossEntropy"));
    CHECK_OK(ct_config_get_reference(cfg, "train", "lr_schedule_fn", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "multifactor"));
    CHECK_OK(ct_config_get_reference(cfg, "train", "inputs", NULL, &s, &err), &err);
    CHECK(s == NULL);  // unbound, default None
    CHECK_OK(ct_config_get_int(cfg, "train", "random_seed", 7, &i, &err), &err);
    CHECK(i == 7);  // bound to None: the program's default
    CHECK_OK(ct_config_get_string(cfg, "train", "checkpoint_highest", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "accuracy"));
    CHECK_OK(ct_config_get_string(cfg, "multifactor", "factors", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "constant * linear_warmup * rsqrt_decay"));
    CHECK_OK(ct_config_get_int(cfg, "trax.supervised.lr_schedules.multifactor", "warmup_steps", 400, &i, &err), &err);
    CHECK(i == 1000);
    CHECK_OK(ct_config_get_int(cfg, "Loop", "n_steps_per_checkpoint", 100, &i, &err), &err);
    CHECK(i == 50);
    const ct_config_value *metrics = NULL;
    CHECK_OK(ct_config_get_list(cfg, "train", "metrics", NULL, &metrics, &err), &err);
    CHECK(metrics && metrics->n == 3 && !strcmp(metrics->items[1].s, "WeightedCategoryAccuracy"));
    int64_t widths[4];
    int n = 0;
    CHECK_OK(ct_config_get_int_list(cfg, "MLP", "layer_widths", NULL, 0, widths, 4, &n, &err), &err);
    CHECK(n == 2 && widths[0] == 64 && widths[1] == 32);
    CHECK(ct_config_get_int_list(cfg, "MLP", "layer_widths", NULL, 0, widths, 1, &n, &err) == CT_ERR_ARG);
    CHECK(strstr(err.msg, "lm.gin:36:20") != NULL);  // too many for max 1: says where the list is

    // Which bindings were used: Adam.b1 and friends were not queried.
    int n_used = 0, n_unused = 0;
    for (int k = 0; k < ct_config_n_bindings(cfg); k++) {
        ct_config_binding_info b = ct_config_binding_at(cfg, k);
        if (b.used) n_used++;
        else n_unused++;
        if (!strcmp(b.name, "Adam") && !strcmp(b.param, "b1"))
            CHECK(!b.used && strstr(b.file, "base.gin") && b.line == 13);
        if (!strcmp(b.name, "TransformerLM") && !strcmp(b.param, "d_model")) CHECK(b.used && b.line == 32);
        if (!strcmp(b.name, "eval/TransformerLM")) CHECK(b.used);
    }
    printf("  lm.gin: %d bindings, %d used, %d unused\n", ct_config_n_bindings(cfg), n_used, n_unused);
    CHECK(ct_config_n_bindings(cfg) == 27 && n_unused == 10);

    // Programmer errors: unregistered name, parameter, or the wrong getter.
    CHECK(ct_config_get_int(cfg, "NoSuchThing", "x", 0, &i, &err) == CT_ERR_STATE);
    CHECK(ct_config_get_int(cfg, "train", "stepz", 0, &i, &err) == CT_ERR_STATE && strstr(err.msg, "'steps'"));
    CHECK(ct_config_get_float(cfg, "train", "steps", 0, &f, &err) == CT_ERR_STATE);
    ct_config_free(cfg);

    // An include beside the including file (the working directory has no ../base.gin).
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_file(cfg, config_path("sub/nested.gin"), &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "d_model", 512, &i, &err), &err);
    CHECK(i == 64);
    ct_config_free(cfg);
}

// ---- Trax's names ---------------------------------------------------------------------------------

static void test_trax_names(void) {
    const char *text =
        "trax.models.TransformerLM.d_ff = 100\n"
        "trax.models.transformer.TransformerLM.n_layers = 3\n"
        "models.TransformerLM.n_heads = 2\n"
        "trax.optimizers.Adam.b1 = 0.8\n"
        "optimizers.SGD.learning_rate = 0.5\n"
        "trax.supervised.lr_schedules.multifactor.constant = 0.2\n"
        "trax.lr.warmup.max_value = 0.3\n"
        "trax.supervised.trainer_lib.train.steps = 9\n"
        "train.loss_fn = @trax.layers.CrossEntropyLoss\n"
        "train.metrics = [@trax.layers.L2Loss, @trax.layers.metrics.SequenceAccuracy(), @CategoryAccuracy]\n"
        "train.model = @trax.models.MLP\n";
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    CHECK_OK(ct_config_parse_text(cfg, text, strlen(text), "trax.gin", &err), &err);
    int64_t i = 0;
    double f = 0;
    const char *s = NULL;
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "d_ff", 0, &i, &err), &err);
    CHECK(i == 100);
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "n_layers", 0, &i, &err), &err);
    CHECK(i == 3);
    CHECK_OK(ct_config_get_int(cfg, "trax.models.TransformerLM", "n_heads", 0, &i, &err), &err);
    CHECK(i == 2);
    CHECK_OK(ct_config_get_float(cfg, "Adam", "b1", 0, &f, &err), &err);
    CHECK(f == 0.8);
    CHECK_OK(ct_config_get_float(cfg, "SGD", "learning_rate", 0, &f, &err), &err);
    CHECK(f == 0.5);
    CHECK_OK(ct_config_get_float(cfg, "multifactor", "constant", 0, &f, &err), &err);
    CHECK(f == 0.2);
    CHECK_OK(ct_config_get_float(cfg, "warmup", "max_value", 0, &f, &err), &err);
    CHECK(f == 0.3);
    CHECK_OK(ct_config_get_int(cfg, "train", "steps", 0, &i, &err), &err);
    CHECK(i == 9);
    CHECK_OK(ct_config_get_reference(cfg, "train", "loss_fn", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "CrossEntropyLoss"));
    CHECK_OK(ct_config_get_reference(cfg, "train", "model", NULL, &s, &err), &err);
    CHECK(s && !strcmp(s, "MLP"));
    const ct_config_value *m = NULL;
    CHECK_OK(ct_config_get_list(cfg, "train", "metrics", NULL, &m, &err), &err);
    CHECK(m && m->n == 3 && !strcmp(m->items[0].s, "L2Loss") && !strcmp(m->items[1].s, "SequenceAccuracy"));
    // Every loss and metric builds from its name.
    // (Trax's current name for SequenceAccuracy is MaskedSequenceAccuracy.)
    const char *layers[] = {"WeightedCategoryCrossEntropy", "CrossEntropyLoss", "CategoryAccuracy",
                            "WeightedCategoryAccuracy", "SequenceAccuracy", "L2Loss", "trax.layers.L2Loss",
                            "BinaryCrossEntropy", "trax.layers.MaskedSequenceAccuracy"};
    for (int k = 0; k < 9; k++) {
        ct_layer *l = build_layer(cfg, layers[k], &err);
        CHECK_MSG(l != NULL, "%s: %s", layers[k], err.msg);
        if (l) ct_layer_free(l);
    }
    CHECK(build_model(cfg, "L2Loss", &err) == NULL && strstr(err.msg, "not a model"));
    CHECK(build_optimizer(cfg, "TransformerLM", &err) == NULL && strstr(err.msg, "not an optimizer"));
    ct_config_free(cfg);

    // A name in the wrong Trax module says where it lives.
    EXPECT_ERROR("trax.gin", "\ntrax.optimizers.TransformerLM.d_model = 8\n", "trax.gin:2:1",
                 "TransformerLM is in trax.models");

    char *reg = ct_config_registry_text();
    CHECK(strstr(reg, "TransformerLM.d_model = 512") && strstr(reg, "Adam.b2 = 0.999") &&
          strstr(reg, "MLP.layer_widths = [128, 64]") && strstr(reg, "\ntrain.steps = 1000  #") &&
          strstr(reg, "\ntrain.optimizer = @Adafactor  #") && strstr(reg, "\nLoop.n_steps_per_checkpoint = 100  #"));
    // Every setting's default comes from its list: none is left to the program.
    CHECK(!strstr(reg, "(the program's default)"));
    ct_free(reg);
}

// ---- Overrides --------------------------------------------------------------------------------------

static void test_overrides(void) {
    ct_error err = {0};
    for (int before = 0; before < 2; before++) {
        ct_config *cfg = ct_config_new();
        if (before) {
            CHECK_OK(ct_config_set(cfg, "TransformerLM.d_model=48", &err), &err);
            CHECK_OK(ct_config_set(cfg, "VOCAB = 100", &err), &err);
        }
        CHECK_OK(ct_config_parse_file(cfg, config_path("lm.gin"), &err), &err);
        if (!before) {
            CHECK_OK(ct_config_set(cfg, "TransformerLM.d_model=48", &err), &err);
            CHECK_OK(ct_config_set(cfg, "VOCAB = 100", &err), &err);
        }
        CHECK_OK(ct_config_set(cfg, "train.model = @trax.models.MLP", &err), &err);
        CHECK_OK(ct_config_set(cfg, "train.steps = 3", &err), &err);
        CHECK_OK(ct_config_set(cfg, "train.steps = 4", &err), &err);  // the later override wins
        CHECK_OK(ct_config_validate(cfg, &err), &err);
        int64_t i = 0;
        const char *s = NULL;
        CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "d_model", 0, &i, &err), &err);
        CHECK_MSG(i == 48, "d_model %lld (override %s)", (long long)i, before ? "first" : "last");
        CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "vocab_size", 0, &i, &err), &err);
        CHECK(i == 100);
        CHECK_OK(ct_config_get_int(cfg, "train", "steps", 0, &i, &err), &err);
        CHECK(i == 4);
        CHECK_OK(ct_config_get_reference(cfg, "train", "model", NULL, &s, &err), &err);
        CHECK(s && !strcmp(s, "MLP"));
        int overrides = 0;
        for (int k = 0; k < ct_config_n_bindings(cfg); k++) {
            ct_config_binding_info b = ct_config_binding_at(cfg, k);
            if (b.override) {
                overrides++;
                CHECK(!strcmp(b.file, "--set") && b.line == 1);
            }
        }
        CHECK(overrides == 3);
        ct_config_free(cfg);
    }
    // Errors in an override name "--set".
    ct_config *cfg = ct_config_new();
    CHECK(ct_config_set(cfg, "TransformerLM.d_modl=3", &err) == CT_ERR_ARG);
    CHECK(strstr(err.msg, "--set:1:1") && strstr(err.msg, "did you mean 'd_model'"));
    printf("  error: %s\n", err.msg);
    CHECK(ct_config_set(cfg, "TransformerLM.d_model 3", &err) == CT_ERR_FORMAT);
    CHECK(strstr(err.msg, "--set:1:23") && strstr(err.msg, "expected '='"));
    printf("  error: %s\n", err.msg);
    CHECK(ct_config_set(cfg, "TransformerLM.d_model='x'", &err) == CT_ERR_ARG && strstr(err.msg, "--set:1"));
    ct_config_free(cfg);
    // What an override includes is an override too: base.gin's d_ff 128
    // wins over a file read after it.
    char inc[4300];
    snprintf(inc, sizeof inc, "include '%s'", config_path("base.gin"));
    cfg = ct_config_new();
    CHECK_OK(ct_config_set(cfg, inc, &err), &err);
    const char *file = "TransformerLM.d_ff = 64\n";
    CHECK_OK(ct_config_parse_text(cfg, file, strlen(file), "f.gin", &err), &err);
    int64_t d_ff = 0;
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "d_ff", 0, &d_ff, &err), &err);
    CHECK_MSG(d_ff == 128, "d_ff %lld: the file's binding replaced the included override", (long long)d_ff);
    ct_config_free(cfg);
}

// ---- Errors: each names the file and line -----------------------------------------------------

static void test_errors(void) {
    // Unknown names, with the closest known one.
    EXPECT_ERROR("e.gin", "# comment\n\nTransfomerLM.d_model = 8\n", "e.gin:3:1", "unknown configurable 'TransfomerLM'",
                 "did you mean 'TransformerLM'");
    EXPECT_ERROR("e.gin", "adam.b1 = 0.5\n", "e.gin:1:1", "did you mean 'Adam'");
    EXPECT_ERROR("e.gin", "TransformerLM.d_model = 8\nTransformerLM.d_modle = 8\n", "e.gin:2:1",
                 "TransformerLM has no parameter 'd_modle'", "did you mean 'd_model'");
    EXPECT_ERROR("e.gin", "Adam.beta1 = 0.9\n", "e.gin:1:1", "did you mean 'b1'");
    // train has more parameters than the message lists: whole names, then a count.
    EXPECT_ERROR("e.gin", "train.stpes = 10\n", "e.gin:1:1", "did you mean 'steps'", "train takes: model, loss_fn, ",
                 " more)");
    EXPECT_ERROR("e.gin", "train.model = @TransformerLMM\n", "e.gin:1:15", "did you mean 'TransformerLM'");
    EXPECT_ERROR("e.gin", "train.metrics = [\n  @CategoryAccuracy,\n  @CategoryAcuracy]\n", "e.gin:3:3",
                 "did you mean 'CategoryAccuracy'");
    EXPECT_ERROR("e.gin", "D = 8\nTransformerLM.d_model = %DD\n", "e.gin:2:25", "undefined macro %DD",
                 "did you mean %D");
    // Wrong types and ranges.
    EXPECT_ERROR("e.gin", "\nTransformerLM.d_model = 'big'\n", "e.gin:2:1", "TransformerLM.d_model expects an int",
                 "'big' (a string)");
    EXPECT_ERROR("e.gin", "TransformerLM.dropout = True\n", "e.gin:1:1", "expects a float");
    EXPECT_ERROR("e.gin", "TransformerLM.learned_positions = 1\n", "e.gin:1:1", "expects a bool");
    EXPECT_ERROR("e.gin", "TransformerLM.n_layers = 2.5\n", "e.gin:1:1", "expects an int");
    EXPECT_ERROR("e.gin", "MLP.layer_widths = 64\n", "e.gin:1:1", "expects a list");
    EXPECT_ERROR("e.gin", "train.checkpoint_highest = @Adam\n", "e.gin:1:1", "expects a string");
    EXPECT_ERROR("e.gin", "train.optimizer = @TransformerLM\n", "e.gin:1:1", "expects a reference to an optimizer",
                 "(a model)");
    EXPECT_ERROR("e.gin", "train.optimizer = 'Adam'\n", "e.gin:1:1", "expects a reference");
    // train.metrics holds losses and metrics only: a model there once trained
    // until its first eval, then failed there without naming the setting.
    EXPECT_ERROR("e.gin", "train.metrics = [@WeightedCategoryAccuracy,\n  @TransformerLM]\n", "e.gin:1:1",
                 "train.metrics expects a list of references to a loss or metric layer",
                 "item 1 is @TransformerLM (a model) at e.gin:2:3");
    EXPECT_ERROR("e.gin", "M = @Adam\ntrain.metrics = [%M]\n", "e.gin:2:1",
                 "item 0 is @Adam (an optimizer) at e.gin:1:5");
    EXPECT_ERROR("e.gin", "train.metrics = [1]\n", "e.gin:1:1", "item 0 is 1 (an int)");
    EXPECT_ERROR("e.gin", "TransformerLM.d_model = None\n", "e.gin:1:1", "cannot be None");
    EXPECT_ERROR("e.gin", "TransformerLM.dropout = 1.0\n", "e.gin:1:1", "must be < 1");
    EXPECT_ERROR("e.gin", "TransformerLM.n_heads = 0\n", "e.gin:1:1", "must be >= 1");
    EXPECT_ERROR("e.gin", "TransformerLM.d_model = 4294967296\n", "e.gin:1:1", "fit in a C int");
    // Through a macro: found by validate, at the binding, saying where the value is.
    EXPECT_ERROR("e.gin", "W = 'wide'\n\nTransformerLM.d_model = %W\n", "e.gin:3:1", "expects an int",
                 "the value is at e.gin:1:5");
    EXPECT_ERROR("e.gin", "A = %B\nB = %A\nTransformerLM.d_model = %A\n", "e.gin:", "cycle");
    // A query checks a macro's value as validate does: a program that reads
    // without validating gets the error, not the int field of a string.
    {
        const char *text = "W = 'wide'\nTransformerLM.d_model = %W\n";
        ct_config *cfg = ct_config_new();
        ct_error err = {0};
        CHECK_OK(ct_config_parse_text(cfg, text, strlen(text), "q.gin", &err), &err);
        int64_t d = 0;
        CHECK(ct_config_get_int(cfg, "TransformerLM", "d_model", 0, &d, &err) == CT_ERR_ARG);
        CHECK_MSG(strstr(err.msg, "q.gin:2:1: TransformerLM.d_model expects an int"), "%s", err.msg);
        ct_config_free(cfg);
    }
    // A macro no binding uses is checked too.
    EXPECT_ERROR("e.gin", "A = 1\nB = [%A, %C]\n", "e.gin:2:10", "undefined macro %C");
    // Macros through macros: 32 deep are read, 33 refused.
    for (int n = 32; n <= 33; n++) {
        char chain[1024];
        int k = 0;
        for (int i = 0; i < n - 1; i++) k += snprintf(chain + k, sizeof chain - (size_t)k, "M%d = %%M%d\n", i, i + 1);
        snprintf(chain + k, sizeof chain - (size_t)k, "M%d = 3\nTransformerLM.d_model = %%M0\n", n - 1);
        if (n == 33) {
            EXPECT_ERROR("e.gin", chain, "e.gin:", "more than 32 deep");
            continue;
        }
        ct_config *cfg = ct_config_new();
        ct_error err = {0};
        ct_status st = ct_config_parse_text(cfg, chain, strlen(chain), "e.gin", &err);
        int64_t d = 0;
        if (st == CT_OK) st = ct_config_validate(cfg, &err);
        if (st == CT_OK) st = ct_config_get_int(cfg, "TransformerLM", "d_model", 0, &d, &err);
        CHECK_MSG(st == CT_OK && d == 3, "a chain of 32 macros: %s", err.msg);
        ct_config_free(cfg);
    }
    {
        // A chain of 40 macros without a cycle: too deep, and said so.
        char chain[1024];
        int n = 0;
        for (int i = 0; i < 40; i++) n += snprintf(chain + n, sizeof chain - (size_t)n, "M%d = %%M%d\n", i, i + 1);
        snprintf(chain + n, sizeof chain - (size_t)n, "M40 = 3\nTransformerLM.d_model = %%M0\n");
        EXPECT_ERROR("e.gin", chain, "e.gin:", "more than 32 deep");
    }
    // Syntax errors: file:line:col and what was expected.
    EXPECT_ERROR("s.gin", "TransformerLM.d_model = 8\nTransformerLM.d_ff 8\n", "s.gin:2:20", "expected '='");
    EXPECT_ERROR("s.gin", "TransformerLM.d_model =\n", "s.gin:1:24", "expected a value, got the end of the line");
    EXPECT_ERROR("s.gin", "train.metrics = [1, 2\n\n", "s.gin:3:1", "expected ',' or ']', got the end of the file");
    EXPECT_ERROR("s.gin", "train.metrics = [1 2]\n", "s.gin:1:20", "expected ',' or ']'");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = 'open\n", "s.gin:1:28", "unterminated string");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = accuracy\n", "s.gin:1:28", "strings need quotes");
    EXPECT_ERROR("s.gin", "train.steps = 5 6\n", "s.gin:1:17", "expected the end of the line");
    EXPECT_ERROR("s.gin", "train.steps = 12abc\n", "s.gin:1:15", "invalid number");
    EXPECT_ERROR("s.gin", "train.steps = 99999999999999999999\n", "s.gin:1:15", "does not fit in 64 bits");
    EXPECT_ERROR("s.gin", "train.steps = 1e999\n", "s.gin:1:15", "out of range");
    EXPECT_ERROR("s.gin", "train.steps = $\n", "s.gin:1:15", "unexpected character '$'");
    // A byte past ASCII is named by its value, not written raw into the message.
    EXPECT_ERROR("s.gin", "train.steps = \xc3\xa9\n", "s.gin:1:15", "unexpected byte 0xc3");
    // An integral float read as an int must fit an int64 (casting 1e30 to one is undefined).
    EXPECT_ERROR("e.gin", "train.steps = 1e30\n", "e.gin:1:1", "train.steps expects an int, got 1e+30 (a float)");
    // 2^63 unsigned does not fit either: in a list, where no range would
    // refuse it, read as -2^63 it would pass silently.
    EXPECT_ERROR("s.gin", "MLP.layer_widths = [9223372036854775808]\n", "s.gin:1:21", "does not fit in 64 bits");
    EXPECT_ERROR("s.gin", "= 3\n", "s.gin:1:1", "expected a binding");
    EXPECT_ERROR("s.gin", "train. = 3\n", "s.gin:1:8", "expected a name after '.'");
    EXPECT_ERROR("s.gin", "train.model = @TransformerLM(3)\n", "s.gin:1:30", "takes no arguments");
    EXPECT_ERROR("s.gin", "include base.gin\n", "s.gin:1:9", "expected a quoted file name");
    EXPECT_ERROR("s.gin", "train.steps = -'a'\n", "s.gin:1:16", "expected a number after the sign");
    EXPECT_ERROR("s.gin", "scope/MACRO = 1\n", "s.gin:1:1", "is not a binding");
    // An import takes one dotted name: gin's newer `import a.b as c` is
    // refused, not half read.
    EXPECT_ERROR("s.gin", "import trax.models as m\n", "s.gin:1:20", "expected the end of the line, got 'as'");
    // A line continued by a backslash counts: what follows names its own line.
    EXPECT_ERROR("s.gin", "train.steps = \\\n  5\ntrain.stepz = 1\n", "s.gin:3:1", "did you mean 'steps'");
    // A Trax module matches whole dotted parts, nothing shorter or longer.
    EXPECT_ERROR("e.gin", "odels.TransformerLM.d_model = 8\n", "e.gin:1:1", "TransformerLM is in trax.models");
    EXPECT_ERROR("e.gin", "trax.modelsX.TransformerLM.d_model = 8\n", "e.gin:1:1", "TransformerLM is in trax.models");
    // A reference's scope is a plain name, as a binding's.
    EXPECT_ERROR("e.gin", "train.optimizer = @a.b/Adam\n", "e.gin:1:19", "scope 'a.b' is not a name");
    // Two letters swapped are one edit: epsilo2n is epsilon2 (plain
    // Levenshtein makes it 2 edits from both, and names epsilon1 first).
    EXPECT_ERROR("e.gin", "Adafactor.epsilo2n = 0.001\n", "e.gin:1:1", "did you mean 'epsilon2'");
    // A setting read as a C int: train.keep_checkpoints = 2^32 was 0 to the
    // Loop, which then kept one checkpoint.
    EXPECT_ERROR("e.gin", "train.keep_checkpoints = 4294967296\n", "e.gin:1:1",
                 "train.keep_checkpoints must be <= 2147483647, got 4294967296");
    {
        char deep[400];
        size_t k = (size_t)snprintf(deep, sizeof deep, "train.metrics = ");
        for (int j = 0; j < 80; j++) deep[k++] = '[';
        deep[k] = '\0';
        EXPECT_ERROR("s.gin", deep, "s.gin:1:", "nested deeper than 64");
    }
    // 64 brackets deep are read, 65 refused.
    for (int depth = 64; depth <= 65; depth++) {
        char text[200];
        size_t k = (size_t)snprintf(text, sizeof text, "MLP.layer_widths = ");
        for (int j = 0; j < depth; j++) text[k++] = '[';
        text[k++] = '1';
        for (int j = 0; j < depth; j++) text[k++] = ']';
        snprintf(text + k, sizeof text - k, "\n");
        if (depth == 65) {
            EXPECT_ERROR("s.gin", text, "s.gin:1:85", "values nested deeper than 64");
            continue;
        }
        ct_config *cfg = ct_config_new();
        ct_error err = {0};
        CHECK_MSG(ct_config_parse_text(cfg, text, strlen(text), "s.gin", &err) == CT_OK, "64 deep: %s", err.msg);
        ct_config_free(cfg);
    }
    {
        const char nul[] = "train.steps = 1\0\n";
        ct_config *cfg = ct_config_new();
        ct_error err = {0};
        CHECK(ct_config_parse_text(cfg, nul, sizeof nul - 1, "nul.gin", &err) == CT_ERR_FORMAT);
        CHECK(strstr(err.msg, "nul.gin:1:16") && strstr(err.msg, "NUL"));
        ct_config_free(cfg);
    }
    // Files: a missing include, a missing file, an include cycle.
    ct_error err = {0};
    ct_config *cfg = ct_config_new();
    CHECK(ct_config_parse_file(cfg, config_path("missing_include.gin"), &err) != CT_OK);
    CHECK_MSG(strstr(err.msg, "missing_include.gin:3:1") && strstr(err.msg, "does_not_exist.gin") &&
                  strstr(err.msg, "No such file"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    cfg = ct_config_new();
    CHECK(ct_config_parse_file(cfg, config_path("no_such_config.gin"), &err) == CT_ERR_IO);
    CHECK(strstr(err.msg, "no_such_config.gin") && strstr(err.msg, "No such file"));
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    cfg = ct_config_new();
    CHECK(ct_config_parse_file(cfg, config_path("cycle_a.gin"), &err) != CT_OK);
    CHECK_MSG(strstr(err.msg, "cycle_b.gin:3:1") && strstr(err.msg, "include cycle") &&
                  strstr(err.msg, "included from") && strstr(err.msg, "cycle_a.gin:2"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
}

// ---- Values as Python reads them (gin parses values with Python's literal syntax) ---------------

// Parses "MLP.layer_widths = list" as py.gin and returns the list (NULL
// after a failed CHECK); *cfg is to be freed.
static const ct_config_value *parse_list(const char *list, ct_config **cfg) {
    char *text = ct_malloc(strlen(list) + 64);
    sprintf(text, "MLP.layer_widths = %s\n", list);
    *cfg = ct_config_new();
    ct_error err = {0};
    const ct_config_value *l = NULL;
    ct_status st = ct_config_parse_text(*cfg, text, strlen(text), "py.gin", &err);
    if (st == CT_OK) st = ct_config_validate(*cfg, &err);
    if (st == CT_OK) st = ct_config_get_list(*cfg, "MLP", "layer_widths", NULL, &l, &err);
    CHECK_MSG(st == CT_OK, "%s: %s", text, err.msg);
    ct_free(text);
    return st == CT_OK ? l : NULL;
}

// Python's escapes: 'a\101' is aA (it was a\101); \x, \u and \U are code
// points, written as UTF-8; r'' keeps its backslashes. What Python refuses,
// and a NUL, which a C string cannot hold, are errors at the escape.
static void test_string_escapes(void) {
    ct_config *cfg;
    const ct_config_value *l = parse_list("['a\\101', '\\a\\b\\f\\v', '\\x41\\xe9', '\\u00e9\\U0001F600', "
                                          "'\\7\\1018\\777', '\\q\\8',\n"
                                          "  r'a\\d\\'', R\"\\n\", u'x', 'con\\\ntinued', 'next']",
                                          &cfg);
    static const char *const want[] = {
        "aA", "\a\b\f\v", "A\xc3\xa9", "\xc3\xa9\xf0\x9f\x98\x80", "\aA8\xc7\xbf",  // U+00E9, U+1F600; \7 is \a; U+01FF
        "\\q\\8", "a\\d\\'", "\\n", "x", "continued", "next"};
    int n = (int)(sizeof want / sizeof want[0]);
    CHECK_MSG(l && l->n == n, "%d items, want %d", l ? l->n : -1, n);
    for (int i = 0; l && i < l->n && i < n; i++)
        CHECK_MSG(l->items[i].kind == CT_CONFIG_STRING && !strcmp(l->items[i].s, want[i]), "item %d is '%s', want '%s'",
                  i, l->items[i].s ? l->items[i].s : "(not a string)", want[i]);
    // After a string continued past a line end, lines and columns count on.
    CHECK(l && l->n == n && l->items[10].line == 3 && l->items[10].col == 10);
    if (l) {  // written back as gin, it reads the same
        char *gin = ct_config_value_to_gin(l);
        ct_config *again;
        const ct_config_value *l2 = parse_list(gin, &again);
        char *gin2 = l2 ? ct_config_value_to_gin(l2) : NULL;
        CHECK_MSG(gin2 && !strcmp(gin, gin2), "%s read back is %s", gin, gin2 ? gin2 : "an error");
        ct_free(gin2);
        ct_free(gin);
        ct_config_free(again);
    }
    ct_config_free(cfg);

    EXPECT_ERROR("s.gin", "train.checkpoint_highest = 'ab\\x4'\n", "s.gin:1:31", "invalid escape '\\x4'",
                 "\\x takes exactly 2 hex digits");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = '\\u12g4'\n", "s.gin:1:29", "\\u takes exactly 4 hex digits");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = '\\ud800'\n", "s.gin:1:29", "'\\ud800'", "surrogate");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = '\\udfff'\n", "s.gin:1:29", "'\\udfff'", "surrogate");
    // The edges of UTF-8's 2, 3 and 4 byte forms, and the last code point.
    l = parse_list("['\\u07ff', '\\u0800', '\\uffff', '\\U00010000', '\\U0010ffff']", &cfg);
    static const char *const edges[] = {"\xdf\xbf", "\xe0\xa0\x80", "\xef\xbf\xbf", "\xf0\x90\x80\x80",
                                        "\xf4\x8f\xbf\xbf"};
    CHECK_MSG(l && l->n == 5, "%d items, want 5", l ? l->n : -1);
    for (int i = 0; l && i < l->n && i < 5; i++)
        CHECK_MSG(l->items[i].kind == CT_CONFIG_STRING && !strcmp(l->items[i].s, edges[i]), "edge %d is '%s'", i,
                  l->items[i].s ? l->items[i].s : "(not a string)");
    ct_config_free(cfg);
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = '\\U00110000'\n", "s.gin:1:29", "'\\U00110000'",
                 "past the last Unicode code point U+10FFFF");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = 'a\\0'\n", "s.gin:1:30", "'\\0'", "NUL");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = '\\x00'\n", "s.gin:1:29", "NUL");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = '\\N{EN DASH}'\n", "s.gin:1:29", "\\N{...}", "not supported");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = b'x'\n", "s.gin:1:28",
                 "bytes literals (b'...') are not supported");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = f'x'\n", "s.gin:1:28", "f-strings");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = r'x\\'\n", "s.gin:1:29", "unterminated string");
    EXPECT_ERROR("s.gin", "train.checkpoint_highest = 'a\\\nb\n", "s.gin:1:28", "unterminated string");
}

// Python 3's number literals: prefixes 0x 0o 0b, '_' between digits. 017 is
// a SyntaxError there (it was read as 17) and 1__0 one (it was 10).
static void test_number_literals(void) {
    ct_config *cfg;
    const ct_config_value *l = parse_list("[0o17, 0O17, 0b101, 0x_1F, 1_000, 00, 0_0, 1_0.5, 017.5, 1e1_0, 5., .5, "
                                          "1E-3, 0b_1_0]",
                                          &cfg);
    static const double want[] = {15, 15, 5, 31, 1000, 0, 0, 10.5, 17.5, 1e10, 5, 0.5, 1e-3, 2};
    static const bool is_int[] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1};
    int n = (int)(sizeof want / sizeof want[0]);
    CHECK_MSG(l && l->n == n, "%d items, want %d", l ? l->n : -1, n);
    for (int i = 0; l && i < l->n && i < n; i++) {
        const ct_config_value *v = &l->items[i];
        bool ok = is_int[i] ? v->kind == CT_CONFIG_INT && v->i == (int64_t)want[i]
                            : v->kind == CT_CONFIG_FLOAT && v->f == want[i];
        CHECK_MSG(ok, "item %d is %s %g, want %g", i, ct_config_kind_name(v->kind),
                  v->kind == CT_CONFIG_INT ? (double)v->i : v->f, want[i]);
    }
    ct_config_free(cfg);

    EXPECT_ERROR("s.gin", "train.steps = 017\n", "s.gin:1:15", "invalid number '017'", "cannot start with 0", "0o17");
    EXPECT_ERROR("s.gin", "train.steps = 0_7\n", "s.gin:1:15", "cannot start with 0");
    EXPECT_ERROR("s.gin", "train.steps = 1__0\n", "s.gin:1:15", "invalid number '1__0'", "'_' may only stand between");
    EXPECT_ERROR("s.gin", "train.steps = 1_\n", "s.gin:1:15", "'_' may only stand between");
    EXPECT_ERROR("s.gin", "train.steps = 1_.5\n", "s.gin:1:15", "'_' may only stand between");
    EXPECT_ERROR("s.gin", "train.steps = 1e1__0\n", "s.gin:1:15", "'_' may only stand between");
    EXPECT_ERROR("s.gin", "train.steps = 0x1F_\n", "s.gin:1:15", "'_' may only stand between");
    EXPECT_ERROR("s.gin", "train.steps = 0o18\n", "s.gin:1:15", "invalid number '0o18'", "digits 0-7");
    EXPECT_ERROR("s.gin", "train.steps = 0b12\n", "s.gin:1:15", "digits 0 and 1");
    EXPECT_ERROR("s.gin", "train.steps = 0x\n", "s.gin:1:15", "no digits after the prefix");
    EXPECT_ERROR("s.gin", "train.steps = 1e+\n", "s.gin:1:15", "expected digits after the exponent");
    EXPECT_ERROR("s.gin", "train.steps = 1j\n", "s.gin:1:15", "invalid number '1j'");
    // The ends of an int64, which Python reads as ints: 2^63 - 1 and -2^63;
    // +2^63 does not fit (it was read as -2^63).
    l = parse_list("[9223372036854775807, -9223372036854775808, 0x7fffffffffffffff]", &cfg);
    CHECK(l && l->n == 3 && l->items[0].i == INT64_MAX && l->items[1].i == INT64_MIN && l->items[2].i == INT64_MAX);
    ct_config_free(cfg);
    EXPECT_ERROR("s.gin", "train.steps = +9223372036854775808\n", "s.gin:1:15", "does not fit in 64 bits");
}

// A float field holds a float32: 1e-50 there was silently 0 (no learning);
// past float32's range it would be inf.
static void test_float32_fields(void) {
    EXPECT_ERROR("f.gin", "Adam.learning_rate = 1e-50\n", "f.gin:1:1", "Adam.learning_rate got 1e-50",
                 "underflows a float32 to 0");
    EXPECT_ERROR("f.gin", "LR = 7e-46\nAdam.b1 = %LR\n", "f.gin:2:1", "Adam.b1 got 7e-46", "underflows a float32",
                 "the value is at f.gin:1:6");
    EXPECT_ERROR("f.gin", "Adam.eps = 3.4028236e38\n", "f.gin:1:1", "Adam.eps must fit in a float32",
                 "3.4028236e+38", "overflows it to inf");
    // FLT_MAX and half an ulp exactly (0x1.ffffffp127) rounds to even: inf.
    EXPECT_ERROR("f.gin", "Adam.eps = 3.4028235677973366e38\n", "f.gin:1:1", "overflows it to inf");
    // The extremes that round to a float32 other than 0 and inf are taken.
    const char *ok = "Adam.learning_rate = 8e-46\nAdam.eps = 3.4028235e38\nAdam.b1 = 0.0\n";
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    ct_status st = ct_config_parse_text(cfg, ok, strlen(ok), "f.gin", &err);
    if (st == CT_OK) st = ct_config_validate(cfg, &err);
    CHECK_MSG(st == CT_OK, "%s", err.msg);
    ct_config_free(cfg);
}

// A value too big for the parser: the error says so, without the macros it
// once blamed when there were none.
static void test_value_size_limit(void) {
    enum { N = 1000000 };
    size_t cap = 2 * (size_t)N + 64;
    char *text = malloc(cap);
    for (int extra = 0; extra <= 1; extra++) {
        size_t k = (size_t)snprintf(text, cap, extra ? "train.metrics = [" : "MLP.layer_widths = [");
        for (int i = 0; i < N + extra; i++) {
            text[k++] = '1';
            text[k++] = ',';
        }
        snprintf(text + k, cap - k, "]\n");
        ct_config *cfg = ct_config_new();
        ct_error err = {0};
        ct_status st = ct_config_parse_text(cfg, text, strlen(text), "big.gin", &err);
        if (extra) {  // N + 1 items
            CHECK(st != CT_OK);
            CHECK_MSG(strstr(err.msg, "big.gin:1:17: a value of more than 1000000 items") && !strstr(err.msg, "macro"),
                      "%s", err.msg);
            printf("  error: %s\n", err.msg);
        } else {  // N items are taken
            if (st == CT_OK) st = ct_config_validate(cfg, &err);
            const ct_config_value *l = NULL;
            if (st == CT_OK) st = ct_config_get_list(cfg, "MLP", "layer_widths", NULL, &l, &err);
            CHECK_MSG(st == CT_OK && l && l->n == N, "%s", err.msg);
        }
        ct_config_free(cfg);
    }
    free(text);
    // (1) is one item, not two: N / 2 + 1 of them, which counted twice
    // would pass the limit, are taken.
    cap = 4 * (size_t)N + 64;
    text = malloc(cap);
    size_t k = (size_t)snprintf(text, cap, "MLP.layer_widths = [");
    for (int i = 0; i < N / 2 + 1; i++) k += (size_t)snprintf(text + k, cap - k, "(1),");
    snprintf(text + k, cap - k, "]\n");
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    CHECK_MSG(ct_config_parse_text(cfg, text, strlen(text), "big.gin", &err) == CT_OK, "%d (1)s: %s", N / 2 + 1,
              err.msg);
    ct_config_free(cfg);
    // Nor do the parentheses count while the 1 inside is read: N - 1 items
    // and a last (1) are N items, taken; a last (1,) is a tuple and its
    // item, N + 1, refused.
    for (int tuple = 0; tuple <= 1; tuple++) {
        k = (size_t)snprintf(text, cap, "MLP.layer_widths = [");
        for (int i = 0; i < N - 1; i++) k += (size_t)snprintf(text + k, cap - k, "1,");
        snprintf(text + k, cap - k, "%s]\n", tuple ? "(1,)" : "(1)");
        cfg = ct_config_new();
        ct_status st = ct_config_parse_text(cfg, text, strlen(text), "big.gin", &err);
        if (tuple) {
            CHECK_MSG(st != CT_OK && strstr(err.msg, "big.gin:1:20: a value of more than 1000000 items"),
                      "last (1,): %s", st == CT_OK ? "taken" : err.msg);
        } else {
            if (st == CT_OK) st = ct_config_validate(cfg, &err);
            const ct_config_value *l = NULL;
            if (st == CT_OK) st = ct_config_get_list(cfg, "MLP", "layer_widths", NULL, &l, &err);
            CHECK_MSG(st == CT_OK && l && l->n == N, "last (1): %s", err.msg);
        }
        ct_config_free(cfg);
    }
    free(text);
    // Through a macro the value counts with its macros replaced: %B of N
    // items is N items, taken; [%B] is N + 1, refused.
    cap = 2 * (size_t)N + 64;
    text = malloc(cap);
    for (int wrapped = 0; wrapped <= 1; wrapped++) {
        k = (size_t)snprintf(text, cap, "B = [");
        for (int i = 0; i < N; i++) k += (size_t)snprintf(text + k, cap - k, "1,");
        snprintf(text + k, cap - k, "]\nMLP.layer_widths = %s\n", wrapped ? "[%B]" : "%B");
        cfg = ct_config_new();
        ct_status st = ct_config_parse_text(cfg, text, strlen(text), "big.gin", &err);
        if (st == CT_OK) st = ct_config_validate(cfg, &err);
        if (wrapped) {
            // Said at the value that uses %B, not somewhere inside B.
            CHECK_MSG(st == CT_ERR_ARG &&
                          strstr(err.msg, "big.gin:2:20: the value expands to more than 1000000 items through macros"),
                      "[%%B]: %s", st == CT_OK ? "taken" : err.msg);
        } else {
            const ct_config_value *l = NULL;
            if (st == CT_OK) st = ct_config_get_list(cfg, "MLP", "layer_widths", NULL, &l, &err);
            CHECK_MSG(st == CT_OK && l && l->n == N, "%%B: %s", err.msg);
        }
        ct_config_free(cfg);
    }
    free(text);
}

// ---- Building models and optimizers -----------------------------------------------------------

static const ct_param *find_param_shape(const ct_net *net, const char *name, int64_t d0, int64_t d1) {
    const ct_param *p = ct_net_find_param(net, name);
    CHECK_MSG(p != NULL, "no weight %s", name);
    if (!p) return NULL;
    CHECK_MSG(p->sig.ndim == 2 && p->sig.shape[0] == d0 && p->sig.shape[1] == d1,
              "%s is (%lld,%lld), expected (%lld,%lld)", name, (long long)p->sig.shape[0],
              (long long)p->sig.shape[1], (long long)d0, (long long)d1);
    return p;
}

static void test_build(void) {
    ct_error err = {0};
    ct_config *cfg = load_lm(&err);
    const char *model_name = NULL, *opt_name = NULL;
    CHECK_OK(ct_config_get_reference(cfg, "train", "model", NULL, &model_name, &err), &err);
    ct_layer *model = model_name ? build_model(cfg, model_name, &err) : NULL;
    CHECK_MSG(model != NULL, "%s", err.msg);
    if (model) {
        int32_t tokens[2 * 8] = {0};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 2, 8, tokens);
        ct_device dev = ct_device_cpu();
        ct_net net;
        CHECK_OK(ct_net_init(&net, model, &in, 1, ct_key_from_seed(0), &dev, &err), &err);
        // vocab 40 (macro from base.gin), d_model 32 (lm.gin), d_ff 128, 2 layers, sinusoidal positions.
        find_param_shape(&net, "TransformerLM/Embedding[1]/embedding", 40, 32);
        find_param_shape(&net, "TransformerLM/Dense[7]/kernel", 32, 40);
        find_param_shape(&net,
                         "TransformerLM/DecoderBlock[5]/Residual[1]/Branch[0]/Parallel[1]/Serial[1]/Dense[1]/kernel",
                         32, 128);
        CHECK(ct_net_find_param(&net, "TransformerLM/DecoderBlock[6]/Residual[0]/Branch[0]/Parallel[1]/Serial[1]/"
                                      "Dense[1]/kernel") == NULL);  // only two blocks: [4] and [5]
        CHECK(net.out_sigs[0].shape[2] == 40);
        printf("  TransformerLM from lm.gin: %zu weights\n", net.n_weights);
        ct_net_free(&net);
        ct_layer_free(model);
    }
    CHECK_OK(ct_config_get_reference(cfg, "train", "optimizer", NULL, &opt_name, &err), &err);
    ct_optimizer *opt = opt_name ? build_optimizer(cfg, opt_name, &err) : NULL;
    CHECK_MSG(opt != NULL, "%s", err.msg);
    if (opt) {
        const ct_adam_params *p = opt->params;
        CHECK(!strcmp(opt->vt->name, "Adam"));
        CHECK(p->b1 == 0.9f && p->b2 == 0.98f && p->eps == 1e-9f && p->weight_decay_rate == 0.0f);
        CHECK(p->learning_rate == ct_adam_default_params().learning_rate);
        ct_optimizer_free(opt);
    }
    // The scoped model: dropout 0 in eval/, everything else shared.
    ct_layer *eval_model = build_model(cfg, "eval/TransformerLM", &err);
    CHECK_MSG(eval_model != NULL, "%s", err.msg);
    if (eval_model) ct_layer_free(eval_model);

    // MLP from (64, 32,) on (2, 3, 4) inputs: Flatten, Dense(64), Relu, Dense(32).
    ct_layer *mlp = build_model(cfg, "MLP", &err);
    CHECK_MSG(mlp != NULL, "%s", err.msg);
    if (mlp) {
        float x[2 * 3 * 4] = {0};
        ct_tensor in = ct_tensor_3d(CT_DTYPE_F32, 2, 3, 4, x);
        ct_device dev = ct_device_cpu();
        ct_net net;
        CHECK_OK(ct_net_init(&net, mlp, &in, 1, ct_key_from_seed(1), &dev, &err), &err);
        find_param_shape(&net, "MLP/Dense[1]/kernel", 12, 64);
        find_param_shape(&net, "MLP/Dense[3]/kernel", 64, 32);
        ct_net_free(&net);
        ct_layer_free(mlp);
    }
    ct_optimizer *sgd = build_optimizer(cfg, "trax.optimizers.SGD", &err);
    CHECK(sgd && ((const ct_sgd_params *)sgd->params)->learning_rate == ct_sgd_default_params().learning_rate);
    if (sgd) ct_optimizer_free(sgd);
    ct_config_free(cfg);

    // The registry's defaults are the C structs' defaults.
    cfg = ct_config_new();
    model = build_model(cfg, "TransformerLM", &err);
    CHECK_MSG(model != NULL, "%s", err.msg);
    if (model) ct_layer_free(model);
    opt = build_optimizer(cfg, "Adam", &err);
    if (opt) ct_optimizer_free(opt);
    char *op = ct_config_operative_text(cfg);
    ct_transformer_lm_params d = ct_transformer_lm_default_params();
    char want[64];
    snprintf(want, sizeof want, "TransformerLM.d_model = %d\n", d.d_model);
    CHECK(strstr(op, want) != NULL);
    CHECK(strstr(op, "TransformerLM.dropout = 0.1\n") && strstr(op, "TransformerLM.learned_positions = False\n"));
    CHECK(strstr(op, "Adam.eps = 1e-05\n") && strstr(op, "Adam.learning_rate = 0.0001\n"));
    ct_free(op);
    ct_config_free(cfg);

    // Checks across parameters and per item name the binding.
    const char *bad = "TransformerLM.d_model = 30\n\nTransformerLM.n_heads = 4\nMLP.layer_widths = [8,\n  0]\n";
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_text(cfg, bad, strlen(bad), "bad.gin", &err), &err);
    CHECK(build_model(cfg, "TransformerLM", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "bad.gin:3:1") && strstr(err.msg, "does not divide"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    CHECK(build_model(cfg, "MLP", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "bad.gin:5:3") && strstr(err.msg, "layer_widths[1]"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    // At most 256 Dense layers: the builder's array holds that many.
    char many[1200];
    size_t k = (size_t)snprintf(many, sizeof many, "MLP.layer_widths = [");
    for (int i = 0; i < 257; i++) k += (size_t)snprintf(many + k, sizeof many - k, "1,");
    snprintf(many + k, sizeof many - k, "]\n");
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_text(cfg, many, strlen(many), "many.gin", &err), &err);
    CHECK(build_model(cfg, "MLP", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "many.gin:1:20: MLP.layer_widths must hold 1 to 256 widths, got 257"), "%s", err.msg);
    ct_config_free(cfg);
}

// ---- The operative config round trip ---------------------------------------------------------

// What a program does with a config: every query it makes.
static void program_queries(ct_config *cfg, ct_error *err) {
    const char *m = NULL, *o = NULL, *l = NULL, *s = NULL;
    int64_t i;
    double f;
    bool b;
    const ct_config_value *v;
    CHECK_OK(ct_config_get_reference(cfg, "train", "model", NULL, &m, err), err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "optimizer", "Adam", &o, err), err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "loss_fn", "WeightedCategoryCrossEntropy", &l, err), err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "inputs", NULL, &s, err), err);
    CHECK_OK(ct_config_get_int(cfg, "train", "steps", 1000, &i, err), err);
    CHECK_OK(ct_config_get_int(cfg, "train", "batch_size", 32, &i, err), err);
    CHECK_OK(ct_config_get_int(cfg, "train", "random_seed", 0, &i, err), err);
    CHECK_OK(ct_config_get_string(cfg, "train", "checkpoint_highest", NULL, &s, err), err);
    CHECK_OK(ct_config_get_string(cfg, "train", "checkpoint_lowest", NULL, &s, err), err);
    CHECK_OK(ct_config_get_list(cfg, "train", "metrics", "[@CategoryAccuracy]", &v, err), err);
    CHECK_OK(ct_config_get_bool(cfg, "train", "use_memory_efficient_trainer", false, &b, err), err);
    CHECK_OK(ct_config_get_string(cfg, "multifactor", "factors", "constant", &s, err), err);
    CHECK_OK(ct_config_get_float(cfg, "multifactor", "constant", 0.1, &f, err), err);
    CHECK_OK(ct_config_get_int(cfg, "multifactor", "warmup_steps", 400, &i, err), err);
    CHECK_OK(ct_config_get_int(cfg, "Loop", "n_steps_per_checkpoint", 100, &i, err), err);
    if (m) {
        ct_layer *model = build_model(cfg, m, err);
        CHECK_MSG(model != NULL, "%s", err->msg);
        if (model) ct_layer_free(model);
    }
    ct_layer *eval_model = build_model(cfg, "eval/TransformerLM", err);
    if (eval_model) ct_layer_free(eval_model);
    if (o) {
        ct_optimizer *opt = build_optimizer(cfg, o, err);
        CHECK_MSG(opt != NULL, "%s", err->msg);
        if (opt) ct_optimizer_free(opt);
    }
}

static void test_operative_round_trip(void) {
    ct_error err = {0};
    ct_config *cfg = load_lm(&err);
    CHECK_OK(ct_config_set(cfg, "TransformerLM.max_len = 64", &err), &err);
    program_queries(cfg, &err);
    char path[] = "/tmp/ctrax_test_config_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
    CHECK_OK(ct_config_write_operative(cfg, path, &err), &err);
    char *text = ct_config_operative_text(cfg);
    printf("---- operative config ----\n%s---- end ----\n", text);
    CHECK(strstr(text, "# Parameters for TransformerLM:\n") && strstr(text, "TransformerLM.d_model = 32\n") &&
          strstr(text, "TransformerLM.max_len = 64\n") && strstr(text, "eval/TransformerLM.dropout = 0.0\n") &&
          strstr(text, "train.model = @TransformerLM\n") &&
          strstr(text, "train.loss_fn = @WeightedCategoryCrossEntropy()\n") &&
          strstr(text, "train.random_seed = None\n") && strstr(text, "train.batch_size = 16\n") &&
          strstr(text, "Adam.eps = 1e-09\n") && strstr(text, "Adam.learning_rate = 0.0001\n") &&
          strstr(text, "multifactor.factors = 'constant * linear_warmup * rsqrt_decay'\n"));
    CHECK(strstr(text, "MLP.") == NULL && strstr(text, "%") == NULL);  // unused configurables, no macros

    // Parsed again, the same queries give the same values: the same text.
    ct_config *again = ct_config_new();
    CHECK_OK(ct_config_parse_file(again, path, &err), &err);
    CHECK_OK(ct_config_validate(again, &err), &err);
    program_queries(again, &err);
    char *text2 = ct_config_operative_text(again);
    CHECK(!strcmp(text, text2));
    int unused = 0;
    for (int k = 0; k < ct_config_n_bindings(again); k++) unused += !ct_config_binding_at(again, k).used;
    CHECK_MSG(unused == 0, "%d bindings of the operative config unused", unused);
    ct_free(text2);
    ct_config_free(again);
    ct_free(text);
    unlink(path);
    CHECK(ct_config_write_operative(cfg, "/nonexistent-dir/config.gin", &err) == CT_ERR_IO &&
          strstr(err.msg, "/nonexistent-dir/config.gin"));
    ct_config_free(cfg);
}

// ---- Optimizers from a config ---------------------------------------------------------------

// A config from text, named `source` in errors, parsed and validated.
static ct_config *parse_cfg(const char *source, const char *text, ct_error *err) {
    ct_config *cfg = ct_config_new();
    CHECK_OK(ct_config_parse_text(cfg, text, strlen(text), source, err), err);
    CHECK_OK(ct_config_validate(cfg, err), err);
    return cfg;
}

static void expect_opt_param(const ct_optimizer *o, const char *param, float want) {
    ct_error err = {0};
    float v = -1;
    CHECK_OK(ct_optimizer_get_param(o, param, &v, &err), &err);
    CHECK_MSG(v == want, "%s.%s = %g, want %g", ct_optimizer_name(o), param, (double)v, (double)want);
}

static void test_optimizers(void) {
    const char *text =
        "trax.optimizers.Momentum.mass = 0.8\n"
        "Momentum.nesterov = False\n"
        "optimizers.RMSProp.gamma = 0.95\n"
        "Adafactor.decay_rate = 0.7\n"
        "Adafactor.factored = False\n"
        "Adafactor.momentum_in_bfloat16 = False  # Trax's, at the value ctrax implements\n"
        "Adafactor.weight_decay_n_steps = 0\n"
        "SM3.momentum = 0.5\n"
        "SM3.momentum_type = 3\n"
        "train.optimizer = @trax.optimizers.SM3\n";
    ct_error err = {0};
    ct_config *cfg = parse_cfg("opt.gin", text, &err);
    struct {
        const char *ref, *name, *param;
        float want;
        const char *other;  // an unbound parameter: its default
        float other_default;
    } cases[] = {
        {"Momentum", "Momentum", "mass", 0.8f, "learning_rate", ct_momentum_default_params().learning_rate},
        {"trax.optimizers.Momentum", "Momentum", "nesterov", 0.0f, "weight_decay_rate",
         ct_momentum_default_params().weight_decay_rate},
        {"RMSProp", "RMSProp", "gamma", 0.95f, "eps", ct_rmsprop_default_params().eps},
        {"Adafactor", "Adafactor", "decay_rate", 0.7f, "epsilon2", ct_adafactor_default_params().epsilon2},
        {"trax.optimizers.Adafactor", "Adafactor", "factored", 0.0f, "do_clipping", 1.0f},
        {"SM3", "SM3", "momentum", 0.5f, "second_moment_averaging", ct_sm3_default_params().second_moment_averaging},
        {"SM3", "SM3", "momentum_type", 3.0f, "learning_rate", ct_sm3_default_params().learning_rate},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ct_optimizer *o = build_optimizer(cfg, cases[k].ref, &err);
        CHECK_MSG(o != NULL, "%s: %s", cases[k].ref, err.msg);
        if (!o) continue;
        CHECK(!strcmp(ct_optimizer_name(o), cases[k].name));
        expect_opt_param(o, cases[k].param, cases[k].want);
        expect_opt_param(o, cases[k].other, cases[k].other_default);
        printf("  %s from opt.gin: %s = %g, %s = %g (default)\n", cases[k].ref, cases[k].param,
               (double)cases[k].want, cases[k].other, (double)cases[k].other_default);
        ct_optimizer_free(o);
    }
    const char *ref = NULL;
    CHECK_OK(ct_config_get_reference(cfg, "train", "optimizer", NULL, &ref, &err), &err);
    ct_optimizer *o = ref ? build_optimizer(cfg, ref, &err) : NULL;
    CHECK(o && !strcmp(ct_optimizer_name(o), "SM3"));
    if (o) ct_optimizer_free(o);
    char *op = ct_config_operative_text(cfg);
    CHECK(strstr(op, "Momentum.mass = 0.8\n") && strstr(op, "SM3.momentum_type = 3\n") &&
          strstr(op, "Adafactor.momentum_in_bfloat16 = False\n") && strstr(op, "RMSProp.learning_rate = 0.001\n"));
    ct_free(op);
    ct_config_free(cfg);

    // Trax's Adafactor parameters ctrax does not implement: only their
    // neutral values load.
    const char *bf16 = "Adafactor.do_momentum = True\nAdafactor.momentum_in_bfloat16 = True\n";
    cfg = parse_cfg("bf.gin", bf16, &err);
    CHECK(build_optimizer(cfg, "Adafactor", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "bf.gin:2:1") && strstr(err.msg, "not supported"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    cfg = parse_cfg("wd.gin", "\nAdafactor.weight_decay_n_steps = 100\n", &err);
    CHECK(build_optimizer(cfg, "Adafactor", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "wd.gin:2:1") && strstr(err.msg, "weight_decay_n_steps = 100"), "%s", err.msg);
    ct_config_free(cfg);
    EXPECT_ERROR("e.gin", "SM3.momentum_type = 4\n", "e.gin:1:1", "must be <= 3");
    EXPECT_ERROR("e.gin", "RMSProp.gamma = 1.5\n", "e.gin:1:1", "must be <= 1");
    // An epsilon of 0 divides 0 by 0 where a gradient is 0: above 0.
    EXPECT_ERROR("e.gin", "Adam.eps = 0\n", "e.gin:1:1", "Adam.eps must be > 0, got 0");
    EXPECT_ERROR("e.gin", "Adafactor.epsilon1 = 0.0\n", "e.gin:1:1", "must be > 0");
    EXPECT_ERROR("e.gin", "RMSProp.eps = 0\n", "e.gin:1:1", "RMSProp.eps must be > 0, got 0");
    // A clipping threshold of 0 divided every update by inf; SM3's EMA
    // momentum of 1 kept m, and so every update, at 0.
    EXPECT_ERROR("e.gin", "Adafactor.clipping_threshold = 0\n", "e.gin:1:1", "must be > 0");
    EXPECT_ERROR("e.gin", "SM3.momentum = 1\n", "e.gin:1:1", "SM3.momentum must be < 1, got 1");
    EXPECT_ERROR("e.gin", "Momentum.nesterov = 1\n", "e.gin:1:1", "expects a bool");
    EXPECT_ERROR("e.gin", "Adafactor.beta2 = 0.9\n", "e.gin:1:1", "did you mean 'beta1'");

    char *reg = ct_config_registry_text();
    CHECK(strstr(reg, "Momentum.mass = 0.9") && strstr(reg, "RMSProp.gamma = 0.9") &&
          strstr(reg, "Adafactor.decay_rate = 0.8") && strstr(reg, "SM3.momentum_type = 1"));
    ct_free(reg);
}

// ---- Schedules from a config ----------------------------------------------------------------

// a and b give the same rate at every step tried, and describe themselves alike.
static void same_schedule(const ct_schedule *a, const ct_schedule *b, const char *what) {
    static const int64_t steps[] = {1, 2, 3, 9, 10, 11, 100, 399, 400, 401, 500, 999, 1000, 1001, 3000, 10000, 20000,
                                    123457};
    int same = 0, n = (int)(sizeof steps / sizeof steps[0]);
    for (int i = 0; i < n; i++) {
        float x = ct_schedule_value(a, steps[i]), y = ct_schedule_value(b, steps[i]);
        CHECK_MSG(x == y, "%s at step %lld: %.9g from the config, %.9g direct", what, (long long)steps[i], (double)x,
                  (double)y);
        same += x == y;
    }
    char da[512], db[512];
    ct_schedule_describe(a, da, sizeof da);
    ct_schedule_describe(b, db, sizeof db);
    CHECK_MSG(!strcmp(da, db), "%s vs %s", da, db);
    printf("  %s: %d/%d steps equal; at 1, 10, 1000: %.6g %.6g %.6g\n", da, same, n, (double)ct_schedule_value(a, 1),
           (double)ct_schedule_value(a, 10), (double)ct_schedule_value(a, 1000));
}

// Builds train.lr_schedule_fn of text and compares it with direct.
static void check_schedule(const char *text, ct_schedule *direct, const char *what) {
    ct_error err = {0};
    ct_config *cfg = parse_cfg("lr.gin", text, &err);
    const char *ref = NULL;
    CHECK_OK(ct_config_get_reference(cfg, "train", "lr_schedule_fn", NULL, &ref, &err), &err);
    ct_schedule *s = ref ? build_schedule(cfg, ref, &err) : NULL;
    CHECK_MSG(s != NULL && direct != NULL, "%s: %s", what, err.msg);
    if (s && direct) same_schedule(s, direct, what);
    ct_schedule_free(s);
    ct_schedule_free(direct);
    ct_config_free(cfg);
}

static void test_schedules(void) {
    ct_error err = {0};
    ct_schedule *d = NULL;
    // Trax's defaults, spelled both ways Trax spells the module.
    ct_multifactor_params mp = ct_multifactor_default_params();
    CHECK_OK(ct_schedule_multifactor(&mp, &d, &err), &err);
    check_schedule("train.lr_schedule_fn = @trax.lr.multifactor\n", d, "multifactor defaults");
    mp.factors = "constant * linear_warmup * rsqrt_decay * decay_every";
    mp.constant = 0.5;
    mp.warmup_steps = 100;
    mp.decay_factor = 0.9;
    mp.steps_per_decay = 1000;
    mp.minimum = 1e-4;
    CHECK_OK(ct_schedule_multifactor(&mp, &d, &err), &err);
    check_schedule("train.lr_schedule_fn = @trax.supervised.lr_schedules.multifactor\n"
                   "multifactor.factors = 'constant * linear_warmup * rsqrt_decay * decay_every'\n"
                   "multifactor.constant = 0.5\n"
                   "multifactor.warmup_steps = 100\n"
                   "multifactor.decay_factor = 0.9\n"
                   "multifactor.steps_per_decay = 1000\n"
                   "multifactor.minimum = 1e-4\n",
                   d, "multifactor with decay_every");
    mp = ct_multifactor_default_params();
    mp.factors = "two_constants * cosine_decay";
    mp.constant = 0.2;
    mp.second_constant = 0.05;
    mp.second_constant_step = 500;
    mp.steps_per_cycle = 3000;
    mp.warmup_steps = 10;
    CHECK_OK(ct_schedule_multifactor(&mp, &d, &err), &err);
    check_schedule("train.lr_schedule_fn = @multifactor\n"
                   "multifactor.factors = 'two_constants * cosine_decay'\n"
                   "multifactor.constant = 0.2\n"
                   "multifactor.second_constant = 0.05\n"
                   "multifactor.second_constant_step = 500\n"
                   "multifactor.steps_per_cycle = 3000\n"
                   "multifactor.warmup_steps = 10\n",
                   d, "multifactor with two_constants and cosine_decay");
    CHECK_OK(ct_schedule_warmup(9, 0.01, &d, &err), &err);
    check_schedule("train.lr_schedule_fn = @trax.lr.warmup\nwarmup.n_warmup_steps = 9\nwarmup.max_value = 0.01\n", d,
                   "warmup");
    CHECK_OK(ct_schedule_warmup_and_rsqrt_decay(400, 0.001, &d, &err), &err);
    check_schedule("train.lr_schedule_fn = @warmup_and_rsqrt_decay\n"
                   "warmup_and_rsqrt_decay.n_warmup_steps = 400\n"
                   "warmup_and_rsqrt_decay.max_value = 0.001\n",
                   d, "warmup_and_rsqrt_decay");
    CHECK_OK(ct_schedule_constant(0.3, &d, &err), &err);
    check_schedule("train.lr_schedule_fn = @trax.supervised.lr_schedules.constant\nconstant.value = 0.3\n", d,
                   "constant");

    // The operative config lists multifactor's defaults, which are Trax's.
    ct_config *cfg = ct_config_new();
    ct_schedule *s = build_schedule(cfg, "multifactor", &err);
    CHECK_MSG(s != NULL, "%s", err.msg);
    ct_schedule_free(s);
    char *op = ct_config_operative_text(cfg);
    CHECK(strstr(op, "multifactor.factors = 'constant * linear_warmup * rsqrt_decay'\n") &&
          strstr(op, "multifactor.constant = 0.1\n") && strstr(op, "multifactor.warmup_steps = 400\n") &&
          strstr(op, "multifactor.second_constant_step = 10000\n") && strstr(op, "multifactor.minimum = 0.0\n"));
    ct_free(op);
    ct_config_free(cfg);

    // Errors: a required parameter unbound; a parameter the constructor
    // refuses, at its binding; not a schedule.
    cfg = parse_cfg("s.gin", "warmup.n_warmup_steps = 5\n", &err);
    CHECK(build_schedule(cfg, "warmup", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "warmup.max_value is not set"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    CHECK(build_schedule(cfg, "constant", &err) == NULL && strstr(err.msg, "constant.value is not set"));
    CHECK(build_schedule(cfg, "Adam", &err) == NULL && strstr(err.msg, "not a learning-rate schedule"));
    ct_config_free(cfg);
    cfg = parse_cfg("s.gin", "multifactor.warmup_steps = 10\nmultifactor.factors = 'constant * bogus'\n", &err);
    CHECK(build_schedule(cfg, "multifactor", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "s.gin:2:1") && strstr(err.msg, "unknown factor 'bogus'"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    cfg = parse_cfg("s.gin", "multifactor.constant = 1.0\nmultifactor.warmup_steps = 0\n", &err);
    CHECK(build_schedule(cfg, "multifactor", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "s.gin:2:1") && strstr(err.msg, "warmup_steps > 0"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    EXPECT_ERROR("e.gin", "multifactor.steps_per_decay = 0\n", "e.gin:1:1", "must be >= 1");
    // A negative learning rate, refused where it is bound.
    cfg = parse_cfg("s.gin", "multifactor.warmup_steps = 10\nmultifactor.constant = -0.1\n", &err);
    CHECK(build_schedule(cfg, "multifactor", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "s.gin:2:1") && strstr(err.msg, "constant must be >= 0"), "%s", err.msg);
    ct_config_free(cfg);
    cfg = parse_cfg("s.gin", "constant.value = -0.001\n", &err);
    CHECK(build_schedule(cfg, "constant", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "s.gin:1:1") && strstr(err.msg, "value must be >= 0"), "%s", err.msg);
    ct_config_free(cfg);

    char *reg = ct_config_registry_text();
    CHECK(strstr(reg, "multifactor.warmup_steps = 400") && strstr(reg, "# warmup.max_value = (required") &&
          strstr(reg, "multifactor.factors = 'constant * linear_warmup * rsqrt_decay'"));
    ct_free(reg);
}

// ---- Settings ----------------------------------------------------------------------------------

static void test_settings(void) {
    ct_error err = {0};
    ct_config *cfg = parse_cfg("set.gin",
                               "train.n_devices = 4\ntrain.adasum = True\ntrain.clip_grad_norm = 1.5\n"
                               "train.keep_checkpoints = 3\ntrain.eval_steps = 7\n",
                               &err);
    int64_t i = 0;
    double f = 0;
    bool b = false;
    CHECK_OK(ct_config_get_int(cfg, "train", "n_devices", 1, &i, &err), &err);
    CHECK(i == 4);
    CHECK_OK(ct_config_get_bool(cfg, "train", "adasum", false, &b, &err), &err);
    CHECK(b);
    CHECK_OK(ct_config_get_float(cfg, "train", "clip_grad_norm", 0.0, &f, &err), &err);
    CHECK(f == 1.5);
    CHECK_OK(ct_config_get_int(cfg, "train", "keep_checkpoints", 2, &i, &err), &err);
    CHECK(i == 3);
    CHECK_OK(ct_config_get_int(cfg, "train", "eval_steps", 1, &i, &err), &err);
    CHECK(i == 7);
    ct_config_free(cfg);
    cfg = parse_cfg("set.gin", "train.clip_grad_norm = None\n", &err);
    CHECK_OK(ct_config_get_float(cfg, "train", "clip_grad_norm", 0.0, &f, &err), &err);
    CHECK(f == 0.0);  // None: off
    CHECK_OK(ct_config_get_int(cfg, "train", "n_devices", 1, &i, &err), &err);
    CHECK(i == 1);
    ct_config_free(cfg);
    EXPECT_ERROR("e.gin", "train.n_devices = 0\n", "e.gin:1:1", "must be >= 1");
    EXPECT_ERROR("e.gin", "train.n_devices = 65\n", "e.gin:1:1", "must be <= 64");
    EXPECT_ERROR("e.gin", "train.keep_checkpoints = 0\n", "e.gin:1:1", "must be >= 1");
    EXPECT_ERROR("e.gin", "train.clip_grad_norm = -1.0\n", "e.gin:1:1", "must be >= 0");
    EXPECT_ERROR("e.gin", "train.adasum = 'yes'\n", "e.gin:1:1", "expects a bool");
}

// ---- Inputs ------------------------------------------------------------------------------------

// An LM batch: inputs and targets int32 (B, T), weights f32 (B, T).
static bool is_lm_batch(const ct_batch *b, int64_t B, int64_t T) {
    bool ok = b->n == 3 && b->t[0].dtype == CT_DTYPE_I32 && b->t[1].dtype == CT_DTYPE_I32 &&
              b->t[2].dtype == CT_DTYPE_F32;
    for (int i = 0; ok && i < 3; i++)
        ok = b->t[i].ndim == 2 && b->t[i].shape[0] == B && b->t[i].shape[1] == T && b->t[i].data != NULL;
    if (!ok && b->n >= 1)
        fprintf(stderr, "  batch: n %d, t[0] %s rank %d (%lld, %lld); want (%lld, %lld)\n", b->n,
                ct_dtype_name(b->t[0].dtype), b->t[0].ndim, (long long)b->t[0].shape[0],
                (long long)b->t[0].shape[1], (long long)B, (long long)T);
    return ok;
}

static bool batches_equal(const ct_batch *a, const ct_batch *b) {
    if (a->n != b->n) return false;
    for (int i = 0; i < a->n; i++) {
        if (a->t[i].dtype != b->t[i].dtype || a->t[i].ndim != b->t[i].ndim) return false;
        for (int d = 0; d < a->t[i].ndim; d++)
            if (a->t[i].shape[d] != b->t[i].shape[d]) return false;
        if (memcmp(a->t[i].data, b->t[i].data, ct_tensor_nbytes(&a->t[i]))) return false;
    }
    return true;
}

// Builds text's inputs `name` twice, with seeds a and b: 1 if their first
// train (or eval) batches are equal, 0 if not, -1 on an error.
static int same_first_batch(const char *text, const char *name, int64_t B, uint64_t a, uint64_t b, bool eval) {
    ct_error err = {0};
    ct_config *cfg = parse_cfg("same.gin", text, &err);
    ct_stream *t1, *e1, *t2, *e2;
    int r = -1;
    if (ct_config_build_inputs(cfg, name, B, a, &t1, &e1, &err) == CT_OK) {
        if (ct_config_build_inputs(cfg, name, B, b, &t2, &e2, &err) == CT_OK) {
            ct_batch x, y;
            if (ct_stream_next(eval ? e1 : t1, &x, &err) == CT_OK && ct_stream_next(eval ? e2 : t2, &y, &err) == CT_OK)
                r = batches_equal(&x, &y);
            ct_stream_free(t2);
            ct_stream_free(e2);
        }
        ct_stream_free(t1);
        ct_stream_free(e1);
    }
    CHECK_MSG(r >= 0, "%s", err.msg);
    ct_config_free(cfg);
    return r;
}

// Checks a copy-task row "0 w 0 w" (w reversed with reverse) padded with
// zeros: returns the length of w, or -1 if the row is wrong.
static int copy_row(const int32_t *x, const int32_t *y, const float *w, int64_t T, int vocab, bool reverse) {
    int n = 0;
    for (int64_t k = 0; k < T; k++) n += w[k] == 1.0f;
    if (2 * n + 2 > T || x[0] != 0 || x[n + 1] != 0) return -1;
    for (int64_t k = 0; k < T; k++) {
        if (x[k] != y[k] || x[k] < 0 || x[k] >= vocab) return -1;
        if (w[k] != (k >= n + 2 && k < 2 * n + 2 ? 1.0f : 0.0f)) return -1;
        if (k >= 2 * n + 2 && x[k] != 0) return -1;  // padding
    }
    for (int k = 0; k < n; k++) {
        if (x[1 + k] < 1) return -1;
        if (x[n + 2 + k] != x[1 + (reverse ? n - 1 - k : k)]) return -1;
    }
    return n;
}

// Checks an addition row "<S> x + y <S> (x+y)" (digits little-endian, token
// d + 1), padded with zeros: returns its unpadded length, or -1.
static int addition_row(const int32_t *x, const float *w, int64_t T, int vocab) {
    int base = vocab - 3, plus = vocab - 2, sep = vocab - 1;
    int64_t k = 0;
    if (x[k++] != sep) return -1;
    long long a = 0, b = 0, c = 0, p = 1;
    for (; k < T && x[k] != plus; k++, p *= base) {
        if (x[k] < 1 || x[k] > base || w[k] != 0.0f) return -1;
        a += (x[k] - 1) * p;
    }
    if (k++ >= T) return -1;
    for (p = 1; k < T && x[k] != sep; k++, p *= base) b += (x[k] - 1) * p;
    if (k++ >= T) return -1;
    for (p = 1; k < T && x[k] != 0; k++, p *= base) {
        if (w[k] != 1.0f) return -1;
        c += (x[k] - 1) * p;
    }
    int len = (int)k;
    for (; k < T; k++)
        if (x[k] != 0 || w[k] != 0.0f) return -1;
    return a + b == c ? len : -1;
}

static void test_synthetic_inputs(void) {
    ct_error err = {0};
    // Trax's copy task: w of 1..5 tokens in training, 8..9 in eval.
    const char *copy = "train.inputs = @trax.data.sequence_copy_inputs\n"
                       "sequence_copy_inputs.vocab_size = 10\n"
                       "CopyInputs.train_length = 6  # the alias\n"
                       "sequence_copy_inputs.eval_min_length = 8\n"
                       "sequence_copy_inputs.eval_max_length = 10\n"
                       "sequence_copy_inputs.pad_to_multiple = 1\n";
    for (int reverse = 0; reverse < 2; reverse++) {
        char text[1024];
        snprintf(text, sizeof text, "%sCopyInputs.reverse = %s\n", copy, reverse ? "True" : "False");
        ct_config *cfg = parse_cfg("copy.gin", text, &err);
        const char *ref = NULL;
        CHECK_OK(ct_config_get_reference(cfg, "train", "inputs", NULL, &ref, &err), &err);
        CHECK(ref && !strcmp(ref, "sequence_copy_inputs"));
        ct_stream *train = NULL, *eval = NULL;
        CHECK_OK(ct_config_build_inputs(cfg, ref ? ref : "?", 4, 1, &train, &eval, &err), &err);
        if (!train || !eval) {
            ct_config_free(cfg);
            continue;
        }
        int seen_train[32] = {0}, seen_eval[32] = {0}, bad = 0;
        for (int step = 0; step < 16; step++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(train, &b, &err), &err);
            CHECK(is_lm_batch(&b, 4, 12));  // padded to 2 * 5 + 2
            for (int r = 0; r < 4 && b.n == 3; r++) {
                int n = copy_row((int32_t *)b.t[0].data + r * 12, (int32_t *)b.t[1].data + r * 12,
                                 (float *)b.t[2].data + r * 12, 12, 10, reverse);
                if (n >= 1 && n <= 5) seen_train[n]++;
                else bad++;
            }
            CHECK_OK(ct_stream_next(eval, &b, &err), &err);
            CHECK(is_lm_batch(&b, 4, 20));  // padded to 2 * 9 + 2
            for (int r = 0; r < 4 && b.n == 3; r++) {
                int n = copy_row((int32_t *)b.t[0].data + r * 20, (int32_t *)b.t[1].data + r * 20,
                                 (float *)b.t[2].data + r * 20, 20, 10, reverse);
                if (n >= 8 && n <= 9) seen_eval[n]++;
                else bad++;
            }
        }
        CHECK(bad == 0);
        int lengths = 0;
        for (int n = 1; n <= 5; n++) lengths += seen_train[n] > 0;
        CHECK(lengths == 5 && seen_eval[8] > 0 && seen_eval[9] > 0);
        char d1[512], d2[512];
        printf("  copy (reverse %d): %d train lengths of w seen in 64 rows, eval w 8: %d, 9: %d, no bad rows: %d\n"
               "    train: %s\n    eval: %s\n",
               reverse, lengths, seen_eval[8], seen_eval[9], bad == 0, ct_stream_describe(train, d1, sizeof d1),
               ct_stream_describe(eval, d2, sizeof d2));
        ct_stream_free(train);
        ct_stream_free(eval);
        ct_config_free(cfg);
    }
    CHECK(same_first_batch(copy, "sequence_copy_inputs", 4, 7, 7, false) == 1);
    CHECK(same_first_batch(copy, "CopyInputs", 4, 7, 7, true) == 1);
    CHECK(same_first_batch(copy, "sequence_copy_inputs", 4, 7, 8, false) == 0);
    CHECK(same_first_batch(copy, "sequence_copy_inputs", 4, 7, 8, true) == 0);

    // pad_to_multiple rounds the fixed length up; unbound (pad 0 here) it
    // is Trax's 32.
    const int pads[] = {0, 8, 32};
    for (int i = 0; i < 3; i++) {
        const int pad = pads[i];
        const int unbound = (int)(strstr(copy, "sequence_copy_inputs.pad_to_multiple") - copy);
        char text[1024];
        if (pad)
            snprintf(text, sizeof text, "%ssequence_copy_inputs.pad_to_multiple = %d\n", copy, pad);
        else
            snprintf(text, sizeof text, "%.*s", unbound, copy);
        ct_config *cfg = parse_cfg("copy.gin", text, &err);
        ct_stream *train = NULL, *eval = NULL;
        CHECK_OK(ct_config_build_inputs(cfg, "CopyInputs", 2, 1, &train, &eval, &err), &err);
        ct_batch b;
        if (train && ct_stream_next(train, &b, &err) == CT_OK) CHECK(is_lm_batch(&b, 2, pad == 8 ? 16 : 32));
        if (eval && ct_stream_next(eval, &b, &err) == CT_OK) CHECK(is_lm_batch(&b, 2, pad == 8 ? 24 : 32));
        ct_stream_free(train);
        ct_stream_free(eval);
        ct_config_free(cfg);
    }

    // Trax's addition task: numbers of 3..5 digits in training, 6..8 in eval.
    const char *add = "train.inputs = @trax.data.addition_inputs\n"
                      "addition_inputs.vocab_size = 13\n"
                      "addition_inputs.train_length = 5\n"
                      "addition_inputs.eval_min_length = 6\n"
                      "addition_inputs.eval_max_length = 8\n";
    for (int pad = 1; pad <= 32; pad += 31) {
        char text[1024];
        snprintf(text, sizeof text, "%saddition_inputs.pad_to_multiple = %d\n", add, pad);
        ct_config *cfg = parse_cfg("add.gin", text, &err);
        ct_stream *train = NULL, *eval = NULL;
        CHECK_OK(ct_config_build_inputs(cfg, "trax.data.addition_inputs", 8, 3, &train, &eval, &err), &err);
        int64_t tt = pad == 1 ? 11 : 32, et = pad == 1 ? 17 : 32;  // 2 * max + 1, or 32
        int bad = 0, longest_train = 0, longest_eval = 0;
        for (int step = 0; step < 8 && train && eval; step++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(train, &b, &err), &err);
            CHECK(is_lm_batch(&b, 8, tt));
            for (int r = 0; r < 8 && b.n == 3; r++) {
                int len = addition_row((int32_t *)b.t[0].data + r * tt, (float *)b.t[2].data + r * tt, tt, 13);
                bad += len < 0 || memcmp((int32_t *)b.t[0].data + r * tt, (int32_t *)b.t[1].data + r * tt,
                                         (size_t)tt * 4);
                if (len > longest_train) longest_train = len;
            }
            CHECK_OK(ct_stream_next(eval, &b, &err), &err);
            CHECK(is_lm_batch(&b, 8, et));
            for (int r = 0; r < 8 && b.n == 3; r++) {
                int len = addition_row((int32_t *)b.t[0].data + r * et, (float *)b.t[2].data + r * et, et, 13);
                bad += len < 0;
                if (len > longest_eval) longest_eval = len;
            }
        }
        CHECK(bad == 0 && longest_train <= 11 && longest_eval > longest_train && longest_eval <= 17);
        printf("  addition (pad_to_multiple %d): train (8, %lld), eval (8, %lld), longest example %d / %d, sums "
               "right: %d\n",
               pad, (long long)tt, (long long)et, longest_train, longest_eval, bad == 0);
        ct_stream_free(train);
        ct_stream_free(eval);
        ct_config_free(cfg);
    }
    CHECK(same_first_batch(add, "addition_inputs", 4, 5, 5, false) == 1);
    CHECK(same_first_batch(add, "addition_inputs", 4, 5, 6, false) == 0);

    // Errors: a required parameter, an empty eval range, not an input, a
    // batch size out of range.
    ct_stream *t = NULL, *e = NULL;
    ct_config *cfg = parse_cfg("c.gin", "sequence_copy_inputs.train_length = 6\n", &err);
    CHECK(ct_config_build_inputs(cfg, "CopyInputs", 4, 1, &t, &e, &err) == CT_ERR_ARG && !t && !e);
    CHECK_MSG(strstr(err.msg, "sequence_copy_inputs.vocab_size is not set"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    CHECK(ct_config_build_inputs(cfg, "Adam", 4, 1, &t, &e, &err) == CT_ERR_ARG && strstr(err.msg, "not an input"));
    ct_config_free(cfg);
    cfg = parse_cfg("c.gin",
                    "sequence_copy_inputs.vocab_size = 10\nsequence_copy_inputs.train_length = 6\n"
                    "sequence_copy_inputs.eval_min_length = 8\nsequence_copy_inputs.eval_max_length = 8\n",
                    &err);
    CHECK(ct_config_build_inputs(cfg, "sequence_copy_inputs", 4, 1, &t, &e, &err) == CT_ERR_ARG && !t && !e);
    CHECK_MSG(strstr(err.msg, "c.gin:4:1") && strstr(err.msg, "eval_max_length 8 must be > eval_min_length 8"), "%s",
              err.msg);
    printf("  error: %s\n", err.msg);
    CHECK(ct_config_build_inputs(cfg, "sequence_copy_inputs", 0, 1, &t, &e, &err) == CT_ERR_ARG &&
          strstr(err.msg, "batch_size 0"));
    ct_config_free(cfg);
    // Training w has train_min_length..train_length-1 tokens: equal bounds leave none.
    cfg = parse_cfg("c.gin",
                    "sequence_copy_inputs.vocab_size = 10\nsequence_copy_inputs.train_length = 6\n"
                    "sequence_copy_inputs.train_min_length = 6\nsequence_copy_inputs.eval_min_length = 8\n"
                    "sequence_copy_inputs.eval_max_length = 9\n",
                    &err);
    CHECK(ct_config_build_inputs(cfg, "sequence_copy_inputs", 4, 1, &t, &e, &err) == CT_ERR_ARG && !t && !e);
    CHECK_MSG(strstr(err.msg, "c.gin:3:1") && strstr(err.msg, "train_min_length 6 must be < train_length 6"), "%s",
              err.msg);
    ct_config_free(cfg);
    EXPECT_ERROR("e.gin", "addition_inputs.vocab_size = 4\n", "e.gin:1:1", "must be >= 5");
    EXPECT_ERROR("e.gin", "CopyInputs.vocab_sise = 4\n", "e.gin:1:1", "did you mean 'vocab_size'");
    EXPECT_ERROR("e.gin", "train.inputs = @CopyInput\n", "e.gin:1:16", "did you mean 'CopyInputs'");
    EXPECT_ERROR("e.gin", "train.inputs = @Adam\n", "e.gin:1:1", "expects a reference to an input stream");
    char *reg = ct_config_registry_text();
    CHECK(strstr(reg, "# sequence_copy_inputs: an input stream (Trax: trax.data.sequence_copy_inputs)") &&
          strstr(reg, "also called: CopyInputs") && strstr(reg, "# sequence_copy_inputs.vocab_size = (required") &&
          strstr(reg, "sequence_copy_inputs.reverse = False") && strstr(reg, "IDXInputs.shuffle = True"));
    ct_free(reg);
}

// ---- Inputs from files ------------------------------------------------------------------------

static char tmp_dir[256];
static char *tmp_file(const char *name) {
    static char buf[4][512];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, sizeof buf[0], "%s/%s", tmp_dir, name);
    return b;
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

static void write_string(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

// An include's relative name is looked for beside the including file and,
// as gin looks, from the working directory; two different files found the
// two ways are an error.
static void test_include_places(void) {
    char dir[] = "/tmp/ctrax_test_config_include_XXXXXX", cwd[4096];
    CHECK(mkdtemp(dir) != NULL && getcwd(cwd, sizeof cwd) != NULL && chdir(dir) == 0);
    CHECK(mkdir("top", 0700) == 0 && mkdir("inc", 0700) == 0 && mkdir("top/inc", 0700) == 0);
    write_string("top/a.gin", "include 'inc/b.gin'\n");
    write_string("inc/b.gin", "TransformerLM.d_model = 32\n");
    ct_error err = {0};
    int64_t d_model = 0;
    // Only from the working directory (gin's way): that file.
    ct_config *cfg = ct_config_new();
    CHECK_OK(ct_config_parse_file(cfg, "top/a.gin", &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "d_model", 512, &d_model, &err), &err);
    CHECK(d_model == 32);
    ct_config_free(cfg);
    // Both ways, one file (a link): that file.
    CHECK(symlink("../../inc/b.gin", "top/inc/b.gin") == 0);
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_file(cfg, "top/a.gin", &err), &err);
    ct_config_free(cfg);
    // Both ways, two files: an error naming both.
    CHECK(unlink("top/inc/b.gin") == 0);
    write_string("top/inc/b.gin", "TransformerLM.d_model = 48\n");
    cfg = ct_config_new();
    CHECK(ct_config_parse_file(cfg, "top/a.gin", &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "top/a.gin:1:1") && strstr(err.msg, "two files by that name") &&
                  strstr(err.msg, "'top/inc/b.gin' beside") && strstr(err.msg, "'inc/b.gin' in the working"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    // Only beside the including file (ctrax's way): that file.
    CHECK(unlink("inc/b.gin") == 0);
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_file(cfg, "top/a.gin", &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "TransformerLM", "d_model", 512, &d_model, &err), &err);
    CHECK(d_model == 48);
    ct_config_free(cfg);
    // Neither: both places named.
    CHECK(unlink("top/inc/b.gin") == 0);
    cfg = ct_config_new();
    CHECK(ct_config_parse_file(cfg, "top/a.gin", &err) != CT_OK);
    CHECK_MSG(strstr(err.msg, "cannot open 'top/inc/b.gin' (beside the including file): No such file") &&
                  strstr(err.msg, "nor 'inc/b.gin' (from the working directory"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    CHECK(unlink("top/a.gin") == 0 && rmdir("top/inc") == 0 && rmdir("top") == 0 && rmdir("inc") == 0);
    // An empty name is said to be one (it opened the directory).
    cfg = ct_config_new();
    CHECK(ct_config_parse_text(cfg, "include ''\n", 11, "e.gin", &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "e.gin:1:1: include '': the file name is empty"), "%s", err.msg);
    ct_config_free(cfg);
    // 1000 includes in all are read, the 1001st is refused.
    write_string("empty.gin", "");
    for (int n = 1000; n <= 1001; n++) {
        size_t len = (size_t)n * 20;
        char *many = malloc(len + 1);
        for (int i = 0; i < n; i++) memcpy(many + (size_t)i * 20, "include 'empty.gin'\n", 20);
        many[len] = '\0';
        cfg = ct_config_new();
        ct_status st = ct_config_parse_text(cfg, many, len, "many.gin", &err);
        bool refused = st == CT_ERR_FORMAT &&
                       strstr(err.msg, "many.gin:1001:1: include 'empty.gin': more than 1000 includes in all");
        CHECK_MSG(n == 1000 ? st == CT_OK : refused, "%d includes: %s", n, err.msg);
        ct_config_free(cfg);
        free(many);
    }
    CHECK(unlink("empty.gin") == 0);
    // A config past 64 MiB is refused before it is read (sparse: no disk used).
    FILE *big = fopen("big.gin", "wb");
    CHECK(big && ftruncate(fileno(big), (64 << 20) + 1) == 0);
    if (big) fclose(big);
    cfg = ct_config_new();
    CHECK(ct_config_parse_file(cfg, "big.gin", &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "big.gin: 67108865 bytes, more than the 67108864"), "%s", err.msg);
    ct_config_free(cfg);
    CHECK(unlink("big.gin") == 0);
    // Files including files: 32 deep are read, 33 are refused.
    for (int i = 0; i <= 32; i++) {
        char name[32], text[64];
        snprintf(name, sizeof name, "d%d.gin", i);
        if (i < 32) snprintf(text, sizeof text, "include 'd%d.gin'\n", i + 1);
        else snprintf(text, sizeof text, "train.steps = 7\n");
        write_string(name, text);
    }
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_file(cfg, "d1.gin", &err), &err);
    ct_config_free(cfg);
    cfg = ct_config_new();
    CHECK(ct_config_parse_file(cfg, "d0.gin", &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "d31.gin:1:1: include 'd32.gin': includes nested deeper than 32"), "%s", err.msg);
    ct_config_free(cfg);
    for (int i = 0; i <= 32; i++) {
        char name[32];
        snprintf(name, sizeof name, "d%d.gin", i);
        CHECK(unlink(name) == 0);
    }
    CHECK(chdir(cwd) == 0 && rmdir(dir) == 0);
}

static void make_tmp_dir(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/ctrax_test_config_inputs_XXXXXX");
    CHECK(mkdtemp(tmp_dir) != NULL);
}

static void remove_tmp(const char *const *names, int n) {
    for (int i = 0; i < n; i++) remove(tmp_file(names[i]));  // files first, then their directories
    rmdir(tmp_dir);
}

// Byte text that never repeats a 16-byte chunk: an LCG over printable bytes.
static void write_text(const char *path, size_t n, uint32_t seed) {
    char *t = malloc(n);
    uint32_t x = seed;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        t[i] = (char)(' ' + (x >> 24) % 95);
    }
    write_bytes(path, t, n);
    free(t);
}

// Is row (T int32) one of the n rows of rows?
static bool has_row(const int32_t *rows, int n, const int32_t *row, int64_t T) {
    for (int i = 0; i < n; i++)
        if (!memcmp(rows + i * T, row, (size_t)T * sizeof *row)) return true;
    return false;
}

static void test_text_inputs(void) {
    make_tmp_dir();
    mkdir(tmp_file("corpus"), 0755);
    mkdir(tmp_file("corpus/sub"), 0755);
    write_text(tmp_file("corpus/a.txt"), 3000, 1);
    write_text(tmp_file("corpus/sub/b.txt"), 2000, 2);
    ct_error err = {0};
    char text[2048];
    snprintf(text, sizeof text,
             "train.inputs = @TextInputs\n"
             "TextInputs.paths = ['%s']\n"
             "TextInputs.seq_len = 16\n"
             "TextInputs.eval_fraction = 0.25\n",
             tmp_file("corpus"));
    ct_config *cfg = parse_cfg("text.gin", text, &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, "TextInputs", 8, 1, &train, &eval, &err), &err);
    if (train && eval) {
        // 5000 bytes: 312 chunks of 16, about a quarter of them eval.
        int32_t train_rows[8 * 16 * 4];
        int n_train = 0, overlap = 0, all_ones = 1, shifted_like = 1;
        for (int step = 0; step < 4; step++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(train, &b, &err), &err);
            CHECK(is_lm_batch(&b, 8, 16));
            if (b.n != 3) break;
            CHECK(!memcmp(b.t[0].data, b.t[1].data, 8 * 16 * 4));  // not shifted: targets are the inputs
            for (int k = 0; k < 8 * 16; k++) all_ones &= ((float *)b.t[2].data)[k] == 1.0f;
            memcpy(train_rows + n_train * 16, b.t[0].data, 8 * 16 * 4);
            n_train += 8;
        }
        // Eval never runs out (it repeats its chunks in order) and never
        // holds a training chunk.
        int eval_batches = 0;
        for (int step = 0; step < 20; step++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(eval, &b, &err), &err);
            if (!is_lm_batch(&b, 8, 16)) break;
            eval_batches++;
            for (int r = 0; r < 8; r++) overlap += has_row(train_rows, n_train, (int32_t *)b.t[0].data + r * 16, 16);
        }
        (void)shifted_like;
        CHECK(all_ones && overlap == 0 && eval_batches == 20);
        char d1[512], d2[512];
        printf("  text: train (8, 16) x 4, eval %d batches (more than its chunks), %d shared rows\n    train: %s\n"
               "    eval: %s\n",
               eval_batches, overlap, ct_stream_describe(train, d1, sizeof d1),
               ct_stream_describe(eval, d2, sizeof d2));
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    CHECK(same_first_batch(text, "TextInputs", 8, 3, 3, false) == 1);
    CHECK(same_first_batch(text, "TextInputs", 8, 3, 4, false) == 0);  // the seed shuffles training
    CHECK(same_first_batch(text, "TextInputs", 8, 3, 4, true) == 1);   // eval is in order, whatever the seed
    {
        // split_seed decides which chunks are eval: another one, another split.
        char other[2300];
        snprintf(other, sizeof other, "%sTextInputs.split_seed = 1\n", text);
        ct_config *c1 = parse_cfg("text.gin", text, &err), *c2 = parse_cfg("text.gin", other, &err);
        ct_stream *t1 = NULL, *e1 = NULL, *t2 = NULL, *e2 = NULL;
        CHECK_OK(ct_config_build_inputs(c1, "TextInputs", 8, 3, &t1, &e1, &err), &err);
        CHECK_OK(ct_config_build_inputs(c2, "TextInputs", 8, 3, &t2, &e2, &err), &err);
        ct_batch x, y;
        if (e1 && e2) {
            CHECK_OK(ct_stream_next(e1, &x, &err), &err);
            CHECK_OK(ct_stream_next(e2, &y, &err), &err);
            CHECK(!batches_equal(&x, &y));
        }
        ct_stream_free(t1), ct_stream_free(e1), ct_stream_free(t2), ct_stream_free(e2);
        ct_config_free(c1), ct_config_free(c2);
    }

    // shifted: targets are the inputs moved left by one; a shuffle buffer
    // instead of full permutations; paths relative to the working directory.
    char cwd[4096];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(tmp_dir) == 0);
    const char *rel = "TextInputs.paths = ['corpus/sub', 'corpus/a.txt']\nTextInputs.seq_len = 16\n"
                      "TextInputs.shifted = True\nTextInputs.shuffle_buffer = 32\n";
    cfg = parse_cfg("rel.gin", rel, &err);
    CHECK_OK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err), &err);
    if (train) {
        ct_batch b;
        CHECK_OK(ct_stream_next(train, &b, &err), &err);
        CHECK(is_lm_batch(&b, 4, 16));
        const int32_t *x = b.t[0].data, *y = b.t[1].data;
        int ok = 1;
        for (int r = 0; r < 4; r++)
            for (int k = 0; k + 1 < 16; k++) ok &= y[r * 16 + k] == x[r * 16 + k + 1];
        CHECK(ok);
        char d[512];
        printf("  text, relative paths, shifted: %s\n", ct_stream_describe(train, d, sizeof d));
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    CHECK(same_first_batch(rel, "TextInputs", 4, 9, 9, false) == 1);
    // eval_fraction 0: no eval stream.
    cfg = parse_cfg("rel.gin", "TextInputs.paths = ['corpus']\nTextInputs.eval_fraction = 0\n", &err);
    CHECK_OK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err), &err);
    CHECK(train != NULL && eval == NULL);
    ct_stream_free(train);
    ct_config_free(cfg);
    CHECK(chdir(cwd) == 0);

    // A missing path: the file and the config line that names it.
    snprintf(text, sizeof text,
             "TextInputs.seq_len = 16\nTextInputs.paths = [\n    '%s',\n    'no/such/file.txt',\n]\n",
             tmp_file("corpus"));
    cfg = parse_cfg("miss.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) == CT_ERR_IO && !train && !eval);
    CHECK_MSG(strstr(err.msg, "miss.gin:4:5") && strstr(err.msg, "TextInputs.paths[1]") &&
                  strstr(err.msg, "'no/such/file.txt'") && strstr(err.msg, "No such file"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    cfg = parse_cfg("miss.gin", "TextInputs.paths = [3]\n", &err);
    CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "miss.gin:1:21") && strstr(err.msg, "paths[0] must be a string"), "%s", err.msg);
    ct_config_free(cfg);
    cfg = parse_cfg("miss.gin", "TextInputs.paths = []\n", &err);
    CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "miss.gin:1:20: TextInputs.paths must list 1 to 4096 files or directories, got 0"), "%s",
              err.msg);
    ct_config_free(cfg);
    {
        char *many = malloc(4097 * 5 + 64);
        size_t k = (size_t)sprintf(many, "TextInputs.paths = [");
        for (int i = 0; i < 4097; i++) k += (size_t)sprintf(many + k, "'x',");
        sprintf(many + k, "]\n");
        cfg = parse_cfg("miss.gin", many, &err);
        CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) == CT_ERR_ARG && !train && !eval);
        CHECK_MSG(strstr(err.msg, "miss.gin:1:20: TextInputs.paths must list 1 to 4096 files or directories, got 4097"),
                  "%s", err.msg);
        ct_config_free(cfg);
        free(many);
    }
    cfg = parse_cfg("miss.gin", "TextInputs.seq_len = 16\n", &err);
    CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "TextInputs.paths is not set"), "%s", err.msg);
    ct_config_free(cfg);
    // Too little text for one example: the stream's error, after the config line.
    snprintf(text, sizeof text, "\nTextInputs.paths = ['%s']\nTextInputs.seq_len = 100000\n", tmp_file("corpus"));
    cfg = parse_cfg("short.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) != CT_OK);
    CHECK_MSG(strstr(err.msg, "short.gin:2:") && strstr(err.msg, "fewer than one example"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    // An eval_fraction that leaves no training chunk: the error names that
    // setting and its line (it named seq_len only).
    snprintf(text, sizeof text,
             "TextInputs.paths = ['%s']\nTextInputs.seq_len = 1000\nTextInputs.eval_fraction = 0.999\n",
             tmp_file("corpus"));
    cfg = parse_cfg("split.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) == CT_ERR_ARG && !train && !eval);
    CHECK_MSG(strstr(err.msg, "split.gin:3:1: TextInputs.eval_fraction = 0.999") &&
                  strstr(err.msg, "the train split of") && strstr(err.msg, "is empty"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    // Which setting is named follows what failed, not the message's words: a
    // file under a directory called "the train split of" that is too short for
    // seq_len is seq_len's error still.
    mkdir(tmp_file("the train split of"), 0755);
    write_text(tmp_file("the train split of/c.txt"), 100, 3);
    snprintf(text, sizeof text, "TextInputs.paths = ['%s']\nTextInputs.seq_len = 1000\nTextInputs.eval_fraction = 0.5\n",
             tmp_file("the train split of/c.txt"));
    cfg = parse_cfg("words.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "TextInputs", 4, 1, &train, &eval, &err) != CT_OK && !train && !eval);
    CHECK_MSG(strstr(err.msg, "(with words.gin:2:1: TextInputs.seq_len = 1000)") &&
                  strstr(err.msg, "fewer than one example") && !strstr(err.msg, "TextInputs.eval_fraction"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    const char *names[] = {"corpus/sub/b.txt", "corpus/a.txt", "corpus/sub", "corpus", "the train split of/c.txt",
                           "the train split of"};
    remove_tmp(names, 6);
}

static void test_token_inputs(void) {
    make_tmp_dir();
    // 1001 uint16 tokens, token i = 7 i mod 50, little-endian.
    uint8_t bytes[2002];
    for (int i = 0; i < 1001; i++) {
        int v = (7 * i) % 50;
        bytes[2 * i] = (uint8_t)v;
        bytes[2 * i + 1] = 0;
    }
    write_bytes(tmp_file("tokens.bin"), bytes, sizeof bytes);
    ct_error err = {0};
    char text[2048];
    snprintf(text, sizeof text,
             "TokenInputs.paths = ['%s']\nTokenInputs.token_bytes = 2\nTokenInputs.vocab_size = 50\n"
             "TokenInputs.seq_len = 10\nTokenInputs.eval_fraction = 0.2\n",
             tmp_file("tokens.bin"));
    ct_config *cfg = parse_cfg("tok.gin", text, &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, "TokenInputs", 4, 1, &train, &eval, &err), &err);
    if (train && eval) {
        int ok = 1;
        ct_batch tb, eb;
        CHECK_OK(ct_stream_next(train, &tb, &err), &err);
        CHECK(is_lm_batch(&tb, 4, 10));
        for (int r = 0; r < 4 && tb.n == 3; r++)
            for (int k = 0; k + 1 < 10; k++) {
                const int32_t *x = (const int32_t *)tb.t[0].data + r * 10;
                ok &= x[k + 1] == (x[k] + 7) % 50;
            }
        CHECK(ok);
        CHECK_OK(ct_stream_next(eval, &eb, &err), &err);
        CHECK(is_lm_batch(&eb, 4, 10));
        CHECK(!batches_equal(&tb, &eb));
        char d[512];
        printf("  tokens: consecutive tokens in every row: %d; eval: %s\n", ok, ct_stream_describe(eval, d, sizeof d));
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    CHECK(same_first_batch(text, "TokenInputs", 4, 2, 2, false) == 1);
    CHECK(same_first_batch(text, "TokenInputs", 4, 2, 3, false) == 0);
    // With a shuffle buffer the epochs under it are in order: a buffer of 1
    // shuffles nothing, so the first batch is chunks 0..3, token j of chunk r
    // being 7 (10 r + j) mod 50.
    snprintf(text, sizeof text,
             "TokenInputs.paths = ['%s']\nTokenInputs.seq_len = 10\nTokenInputs.eval_fraction = 0\n"
             "TokenInputs.shuffle_buffer = 1\n",
             tmp_file("tokens.bin"));
    cfg = parse_cfg("tok.gin", text, &err);
    CHECK_OK(ct_config_build_inputs(cfg, "TokenInputs", 4, 1, &train, &eval, &err), &err);
    if (train) {
        ct_batch tb;
        CHECK_OK(ct_stream_next(train, &tb, &err), &err);
        int in_order = tb.n == 3 && is_lm_batch(&tb, 4, 10);
        for (int i = 0; in_order && i < 40; i++) in_order = ((const int32_t *)tb.t[0].data)[i] == (7 * i) % 50;
        CHECK_MSG(in_order, "shuffle_buffer 1: the first batch is not chunks 0..3 in order");
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);

    // Errors: a token width that does not exist, one the file does not fit,
    // a token out of the vocabulary, a missing file.
    struct {
        const char *binding, *want1, *want2;
    } bad[] = {
        {"TokenInputs.token_bytes = 3", "bad.gin:2:1", "token_bytes must be 2 (uint16) or 4 (uint32), got 3"},
        {"TokenInputs.token_bytes = 4", "bad.gin:1:", "size 2002 bytes is not a multiple of 4"},
    };
    for (int k = 0; k < 2; k++) {
        snprintf(text, sizeof text, "TokenInputs.paths = ['%s']\n%s\nTokenInputs.seq_len = 10\n",
                 tmp_file("tokens.bin"), bad[k].binding);
        cfg = parse_cfg("bad.gin", text, &err);
        CHECK(ct_config_build_inputs(cfg, "TokenInputs", 4, 1, &train, &eval, &err) != CT_OK && !train && !eval);
        CHECK_MSG(strstr(err.msg, bad[k].want1) && strstr(err.msg, bad[k].want2) &&
                      (k == 0 || strstr(err.msg, "tokens.bin")),
                  "%s", err.msg);
        // A file the width does not fit names the width's setting, the one to change.
        CHECK_MSG(k == 0 || strstr(err.msg, "bad.gin:2:1: TokenInputs.token_bytes = 4"), "%s", err.msg);
        printf("  error: %s\n", err.msg);
        ct_config_free(cfg);
    }
    // Tokens are checked against vocab_size as they are read.
    snprintf(text, sizeof text, "TokenInputs.paths = ['%s']\nTokenInputs.vocab_size = 20\nTokenInputs.seq_len = 10\n",
             tmp_file("tokens.bin"));
    cfg = parse_cfg("bad.gin", text, &err);
    CHECK_OK(ct_config_build_inputs(cfg, "TokenInputs", 4, 1, &train, &eval, &err), &err);
    if (train) {
        ct_batch b;
        CHECK(ct_stream_next(eval, &b, &err) == CT_ERR_FORMAT);
        CHECK_MSG(strstr(err.msg, "tokens.bin: token") && strstr(err.msg, "is not below vocab_size 20"), "%s", err.msg);
        // Found while training, far from the config: it names the setting
        // (not the model's vocab_size, which the file may well fit).
        CHECK_MSG(strstr(err.msg, "vocab_size from bad.gin:2:1: TokenInputs.vocab_size = 20"), "%s", err.msg);
        printf("  error: %s\n", err.msg);
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    snprintf(text, sizeof text, "TokenInputs.paths = ['%s']\n", tmp_file("nothere.bin"));
    cfg = parse_cfg("bad.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "TokenInputs", 4, 1, &train, &eval, &err) == CT_ERR_IO);
    CHECK_MSG(strstr(err.msg, "bad.gin:1:22") && strstr(err.msg, "nothere.bin") && strstr(err.msg, "No such file"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    EXPECT_ERROR("e.gin", "TokenInputs.token_bytes = 8\n", "e.gin:1:1", "must be <= 4");
    const char *names[] = {"tokens.bin"};
    remove_tmp(names, 1);
}

// IDX files: n images of 28x28 (pixel j of image i is (31 i + j) mod 256)
// and n labels (i + first) mod 10.
static void write_idx(const char *images, const char *labels, int n, int first) {
    size_t ni = 16 + (size_t)n * 784, nl = 8 + (size_t)n;
    uint8_t *im = calloc(ni, 1), *lb = calloc(nl, 1);
    const uint8_t him[] = {0, 0, 8, 3, 0, 0, 0, (uint8_t)n, 0, 0, 0, 28, 0, 0, 0, 28};
    const uint8_t hlb[] = {0, 0, 8, 1, 0, 0, 0, (uint8_t)n};
    memcpy(im, him, sizeof him);
    memcpy(lb, hlb, sizeof hlb);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 784; j++) im[16 + (size_t)i * 784 + (size_t)j] = (uint8_t)((31 * i + j) & 255);
        lb[8 + i] = (uint8_t)((i + first) % 10);
    }
    write_bytes(images, im, ni);
    write_bytes(labels, lb, nl);
    free(im);
    free(lb);
}

// An IDX batch: images f32 (B, 28, 28), labels int32 (B), weights f32 (B).
static bool is_idx_batch(const ct_batch *b, int64_t B) {
    return b->n == 3 && b->t[0].dtype == CT_DTYPE_F32 && b->t[0].ndim == 3 && b->t[0].shape[0] == B &&
           b->t[0].shape[1] == 28 && b->t[0].shape[2] == 28 && b->t[1].dtype == CT_DTYPE_I32 && b->t[1].ndim == 1 &&
           b->t[1].shape[0] == B && b->t[2].dtype == CT_DTYPE_F32 && b->t[2].ndim == 1 && b->t[2].shape[0] == B;
}

static void test_idx_inputs(void) {
    make_tmp_dir();
    write_idx(tmp_file("train-images"), tmp_file("train-labels"), 10, 0);
    write_idx(tmp_file("eval-images"), tmp_file("eval-labels"), 6, 5);
    ct_error err = {0};
    char text[4096];
    snprintf(text, sizeof text,
             "train.inputs = @IDXInputs\n"
             "IDXInputs.train_images = '%s'\nIDXInputs.train_labels = '%s'\n"
             "IDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
             tmp_file("train-images"), tmp_file("train-labels"), tmp_file("eval-images"), tmp_file("eval-labels"));
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        char t2[4200];
        snprintf(t2, sizeof t2, "%sIDXInputs.shuffle = %s\n", text, shuffle ? "True" : "False");
        ct_config *cfg = parse_cfg("idx.gin", t2, &err);
        ct_stream *train = NULL, *eval = NULL;
        CHECK_OK(ct_config_build_inputs(cfg, "IDXInputs", 4, 1, &train, &eval, &err), &err);
        if (train && eval) {
            ct_batch b;
            int ok = 1, in_order = 1;
            for (int step = 0; step < 5; step++) {  // 20 examples: two epochs of 10
                CHECK_OK(ct_stream_next(train, &b, &err), &err);
                CHECK(is_idx_batch(&b, 4));
                if (b.n != 3) break;
                const float *x = b.t[0].data, *w = b.t[2].data;
                const int32_t *y = b.t[1].data;
                for (int r = 0; r < 4; r++) {
                    int i = y[r];  // label i is image i
                    ok &= i >= 0 && i < 10 && w[r] == 1.0f;
                    for (int j = 0; j < 784; j += 97) ok &= x[r * 784 + j] == (float)((31 * i + j) & 255) / 255.0f;
                    in_order &= i == (step * 4 + r) % 10;
                }
            }
            CHECK(ok && in_order == !shuffle);
            int eval_ok = 1;
            for (int step = 0; step < 4; step++) {  // 16 examples: eval's 6, in order, repeated
                CHECK_OK(ct_stream_next(eval, &b, &err), &err);
                CHECK(is_idx_batch(&b, 4));
                if (b.n != 3) break;
                for (int r = 0; r < 4; r++) eval_ok &= ((int32_t *)b.t[1].data)[r] == ((step * 4 + r) % 6 + 5) % 10;
            }
            CHECK(eval_ok);
            char d1[512], d2[512];
            printf("  idx (shuffle %d): images (4, 28, 28), labels (4,), weights (4,); pixels right: %d, train in file "
                   "order: %d, eval in order: %d\n    train: %s\n    eval: %s\n",
                   shuffle, ok, in_order, eval_ok, ct_stream_describe(train, d1, sizeof d1),
                   ct_stream_describe(eval, d2, sizeof d2));
        }
        ct_stream_free(train);
        ct_stream_free(eval);
        ct_config_free(cfg);
    }
    CHECK(same_first_batch(text, "IDXInputs", 4, 1, 1, false) == 1);
    CHECK(same_first_batch(text, "IDXInputs", 4, 1, 2, false) == 0);
    CHECK(same_first_batch(text, "IDXInputs", 4, 1, 2, true) == 1);
    {
        // Train and eval differ.
        ct_config *cfg = parse_cfg("idx.gin", text, &err);
        ct_stream *train = NULL, *eval = NULL;
        CHECK_OK(ct_config_build_inputs(cfg, "IDXInputs", 4, 1, &train, &eval, &err), &err);
        ct_batch a, b;
        if (train && eval && ct_stream_next(train, &a, &err) == CT_OK && ct_stream_next(eval, &b, &err) == CT_OK)
            CHECK(!batches_equal(&a, &b));
        ct_stream_free(train);
        ct_stream_free(eval);
        ct_config_free(cfg);
    }

    // Errors: a missing file at its config line; labels given as images (the
    // stream's error, after the config line); a required path unbound.
    snprintf(text, sizeof text,
             "IDXInputs.train_images = '%s'\nIDXInputs.train_labels = '%s'\n"
             "IDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
             tmp_file("train-images"), tmp_file("train-labels"), tmp_file("eval-images"), tmp_file("no-labels"));
    ct_config *cfg = parse_cfg("idx.gin", text, &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK(ct_config_build_inputs(cfg, "IDXInputs", 4, 1, &train, &eval, &err) == CT_ERR_IO && !train && !eval);
    CHECK_MSG(strstr(err.msg, "idx.gin:4:25") && strstr(err.msg, "IDXInputs.eval_labels") &&
                  strstr(err.msg, "no-labels") && strstr(err.msg, "No such file"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    snprintf(text, sizeof text,
             "IDXInputs.train_images = '%s'\nIDXInputs.train_labels = '%s'\n"
             "IDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
             tmp_file("train-labels"), tmp_file("train-labels"), tmp_file("eval-images"), tmp_file("eval-labels"));
    cfg = parse_cfg("idx.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "IDXInputs", 4, 1, &train, &eval, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "idx.gin:1:") && strstr(err.msg, "bad magic"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    // Images given as labels: the labels' setting and line.
    snprintf(text, sizeof text,
             "IDXInputs.train_images = '%s'\nIDXInputs.train_labels = '%s'\n"
             "IDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
             tmp_file("train-images"), tmp_file("eval-images"), tmp_file("eval-images"), tmp_file("eval-labels"));
    cfg = parse_cfg("idx.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "IDXInputs", 4, 1, &train, &eval, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "idx.gin:2:") && strstr(err.msg, "IDXInputs.train_labels") &&
                  strstr(err.msg, "bad magic 0x00000803"),
              "%s", err.msg);
    ct_config_free(cfg);
    // A labels file whose path holds the images file's path: still the
    // labels' setting (the stream says which file failed, not the message).
    write_idx(tmp_file("train-images.labels"), tmp_file("unused-labels"), 4, 0);  // images where labels belong
    snprintf(text, sizeof text,
             "IDXInputs.train_images = '%s'\nIDXInputs.train_labels = '%s'\n"
             "IDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
             tmp_file("train-images"), tmp_file("train-images.labels"), tmp_file("eval-images"),
             tmp_file("eval-labels"));
    cfg = parse_cfg("idx.gin", text, &err);
    CHECK(ct_config_build_inputs(cfg, "IDXInputs", 4, 1, &train, &eval, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "idx.gin:2:") && strstr(err.msg, "IDXInputs.train_labels") &&
                  strstr(err.msg, "bad magic 0x00000803"),
              "%s", err.msg);
    ct_config_free(cfg);
    cfg = parse_cfg("idx.gin", "IDXInputs.n_classes = 10\n", &err);
    CHECK(ct_config_build_inputs(cfg, "IDXInputs", 4, 1, &train, &eval, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "IDXInputs.train_images is not set"), "%s", err.msg);
    ct_config_free(cfg);
    const char *names[] = {"train-images", "train-labels", "eval-images", "eval-labels", "train-images.labels",
                           "unused-labels"};
    remove_tmp(names, 6);
}

// ---- A whole run from one config ----------------------------------------------------------------

// copy_run.gin describes a run: every piece builds from it, and the Loop
// trains and evaluates with them.
static void test_whole_run(void) {
    ct_error err = {0};
    ct_config *cfg = ct_config_new();
    CHECK_OK(ct_config_parse_file(cfg, config_path("copy_run.gin"), &err), &err);
    CHECK_OK(ct_config_validate(cfg, &err), &err);
    const char *model_ref = NULL, *inputs_ref = NULL, *opt_ref = NULL, *lr_ref = NULL, *loss_ref = NULL;
    const ct_config_value *metrics = NULL;
    int64_t batch_size = 0, seed = 0, steps = 0, eval_steps = 0, n_devices = 0, keep = 0;
    double clip = 0;
    bool adasum = true;
    CHECK_OK(ct_config_get_reference(cfg, "train", "model", NULL, &model_ref, &err), &err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "inputs", NULL, &inputs_ref, &err), &err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "optimizer", "Adam", &opt_ref, &err), &err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "lr_schedule_fn", NULL, &lr_ref, &err), &err);
    CHECK_OK(ct_config_get_reference(cfg, "train", "loss_fn", "WeightedCategoryCrossEntropy", &loss_ref, &err), &err);
    CHECK_OK(ct_config_get_list(cfg, "train", "metrics", NULL, &metrics, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "batch_size", 32, &batch_size, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "random_seed", 0, &seed, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "steps", 100, &steps, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "eval_steps", 1, &eval_steps, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "n_devices", 1, &n_devices, &err), &err);
    CHECK_OK(ct_config_get_bool(cfg, "train", "adasum", false, &adasum, &err), &err);
    CHECK_OK(ct_config_get_float(cfg, "train", "clip_grad_norm", 0.0, &clip, &err), &err);
    CHECK_OK(ct_config_get_int(cfg, "train", "keep_checkpoints", 2, &keep, &err), &err);
    CHECK(model_ref && inputs_ref && opt_ref && lr_ref && loss_ref && metrics && metrics->n == 2);
    if (!(model_ref && inputs_ref && opt_ref && lr_ref && loss_ref && metrics && metrics->n == 2)) {
        ct_config_free(cfg);
        return;
    }
    ct_layer *model = build_model(cfg, model_ref, &err);
    CHECK_MSG(model != NULL, "%s", err.msg);
    ct_layer *loss = build_layer(cfg, loss_ref, &err);
    ct_layer *m0 = build_layer(cfg, metrics->items[0].s, &err);
    ct_layer *m1 = build_layer(cfg, metrics->items[1].s, &err);
    ct_optimizer *opt = build_optimizer(cfg, opt_ref, &err);
    CHECK_MSG(opt != NULL, "%s", err.msg);
    ct_schedule *lr = build_schedule(cfg, lr_ref, &err);
    CHECK_MSG(lr != NULL, "%s", err.msg);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, inputs_ref, batch_size, (uint64_t)seed, &train, &eval, &err), &err);
    if (model && loss && m0 && m1 && opt && lr && train && eval) {
        ct_train_task task = {.stream = train, .loss = loss, .optimizer = opt, .lr_schedule = lr, .loss_name = "loss"};
        opt = NULL;  // the loop owns it
        ct_eval_task ev = {.stream = eval, .n_metrics = 2, .n_batches = (int)eval_steps};
        ev.metrics[0] = m0;
        ev.metrics[1] = m1;
        ev.metric_names[0] = "loss";
        ev.metric_names[1] = "accuracy";
        ct_loop_options o = ct_loop_default_options();
        o.seed = (uint64_t)seed;
        o.keep_last = (int)keep;
        o.trainer.n_devices = (int)n_devices;
        o.trainer.adasum = adasum;
        o.trainer.clip_grad_norm = (float)clip;
        ct_loop *loop = NULL;
        CHECK_OK(ct_loop_new(&loop, model, &task, 1, &ev, &o, &err), &err);
        if (loop) {
            CHECK_OK(ct_loop_run(loop, steps, &err), &err);
            double train_loss = ct_loop_last_value(loop, "train", "metrics/loss");
            double eval_loss = ct_loop_last_value(loop, "eval", "metrics/loss");
            double eval_acc = ct_loop_last_value(loop, "eval", "metrics/accuracy");
            printf("  copy_run.gin: %lld steps, train loss %.4f, eval loss %.4f, eval accuracy %.4f (ln 8 = %.4f)\n",
                   (long long)ct_loop_step(loop), train_loss, eval_loss, eval_acc, log(8.0));
            CHECK(ct_loop_step(loop) == 3 && isfinite(train_loss) && isfinite(eval_loss) && eval_acc >= 0 &&
                  eval_acc <= 1);
            ct_loop_free(loop);
        }
    }
    ct_optimizer_free(opt);
    ct_schedule_free(lr);
    ct_stream_free(train);
    ct_stream_free(eval);
    if (model) ct_layer_free(model);
    if (loss) ct_layer_free(loss);
    if (m0) ct_layer_free(m0);
    if (m1) ct_layer_free(m1);
    // Every binding of the run was used.
    for (int k = 0; k < ct_config_n_bindings(cfg); k++) {
        ct_config_binding_info b = ct_config_binding_at(cfg, k);
        CHECK_MSG(b.used || !strcmp(b.name, "eval/TransformerLM"), "%s.%s (%s:%d) unused", b.name, b.param, b.file,
                  b.line);
    }
    ct_config_free(cfg);
}

// ---- Fuzz-ish: prefixes and mutations ------------------------------------------------------

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// Parses len bytes from an exactly sized heap copy (so ASan sees any read
// past the end), then validates, queries and writes the operative config.
static int parse_exact(const char *text, size_t len) {
    char *copy = malloc(len ? len : 1);
    memcpy(copy, text, len);
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    ct_status st = ct_config_parse_text(cfg, copy, len, "fuzz.gin", &err);
    if (st == CT_OK) st = ct_config_validate(cfg, &err);
    if (st == CT_OK) {
        int64_t i;
        double f;
        const char *s;
        const ct_config_value *v;
        ct_config_get_int(cfg, "TransformerLM", "d_model", 8, &i, &err);
        ct_config_get_float(cfg, "TransformerLM", "dropout", 0.0, &f, &err);
        ct_config_get_reference(cfg, "train", "model", NULL, &s, &err);
        ct_config_get_list(cfg, "train", "metrics", NULL, &v, &err);
        ct_config_get_list(cfg, "MLP", "layer_widths", NULL, &v, &err);
        ct_config_get_string(cfg, "train", "checkpoint_highest", NULL, &s, &err);
        ct_free(ct_config_operative_text(cfg));
    } else {
        CHECK_MSG(strncmp(err.msg, "fuzz.gin:", 9) == 0 || strstr(err.msg, "include"), "error without a place: %s",
                  err.msg);
    }
    ct_config_free(cfg);
    free(copy);
    return st == CT_OK;
}

static void test_fuzz(void) {
    const char *names[] = {"lm.gin", "base.gin"};
    char *texts[3];
    size_t lens[3];
    for (int k = 0; k < 2; k++) {
        texts[k] = read_all(config_path(names[k]), &lens[k]);
        CHECK(texts[k] != NULL);
        if (!texts[k]) return;
    }
    // lm.gin without its include, so that every prefix that ends cleanly parses.
    const char *types = "MLP.layer_widths = [0x1F, -5, 1., .5, 1e-4, 'a\\n' \"b\", True, None, @Adam(), %M,\n"
                        "  (1,), (2), {'k': [1, (2, 3)]}, []]  # c\nM = \\\n 3\ntrain.steps = -0\n";
    texts[2] = strdup(types);
    lens[2] = strlen(types);
    int prefixes = 0, ok = 0;
    for (int k = 0; k < 3; k++) {
        for (size_t n = 0; n <= lens[k]; n++) {
            ok += parse_exact(texts[k], n);
            prefixes++;
        }
    }
    const char alphabet[] = "[](){}'\"@%=.,:/\\#\n -+0e9xTN_";
    // CTRAX_FUZZ_ITERS=N runs more (or fewer) mutations than the default.
    const char *env = getenv("CTRAX_FUZZ_ITERS");
    int iters = env ? atoi(env) : 20000;
    int mutations = 0, mutated_ok = 0;
    for (int iter = 0; iter < iters; iter++) {
        int k = (int)(rnd() % 3);
        size_t len = lens[k];
        char *m = malloc(len + 8);
        memcpy(m, texts[k], len);
        int edits = 1 + (int)(rnd() % 4);
        for (int e = 0; e < edits; e++) {
            size_t at = len ? (size_t)(rnd() % len) : 0;
            char c = (rnd() % 4) ? alphabet[rnd() % (sizeof alphabet - 1)] : (char)(rnd() & 0xff);
            switch (rnd() % 3) {
            case 0:
                if (len) m[at] = c;
                break;
            case 1:  // insert
                memmove(m + at + 1, m + at, len - at);
                m[at] = c;
                len++;
                break;
            default:  // delete
                if (len) {
                    memmove(m + at, m + at + 1, len - at - 1);
                    len--;
                }
            }
            if (len + 1 >= lens[k] + 8) break;
        }
        mutated_ok += parse_exact(m, len);
        mutations++;
        free(m);
    }
    printf("  fuzz: %d prefixes (%d parsed and validated), %d mutations (%d parsed), no crash\n", prefixes, ok,
           mutations, mutated_ok);
    CHECK(ok > 10 && mutations == iters);
    for (int k = 0; k < 3; k++) free(texts[k]);
}

// ---- Memory budgets ------------------------------------------------------------------------

// The estimate of a small run against what a trainer really holds: the
// planned weights are the net's exactly; the model's bytes (weights,
// gradients, Adam's slots) are the device's slabs within their 64-byte
// padding, plus the sinusoid table (host_floats, not on the device); and
// one step's activations are at most what the step's arena reserved (an
// estimate from below refuses nothing that fits) but not far below it.
// With loss_chunk > 0 the run and the trainer chunk the loss
// (train.loss_chunk_size); returns the estimated activation bytes.
static double check_estimate_chunked(const char *what, const char *text, const char *model_name, double host_floats,
                                     int batch_size, int64_t loss_chunk) {
    ct_error err = {0};
    ct_config *cfg = parse_cfg("budget.gin", text, &err);
    ct_config_run_shape run = {.model = model_name, .optimizer = "Adam", .inputs = "sequence_copy_inputs",
                               .batch_size = batch_size, .n_devices = 1, .loss_chunk_size = loss_chunk};
    ct_config_memory mem;
    CHECK_OK(ct_config_check_memory(cfg, &run, &mem, &err), &err);
    CHECK(mem.example_length > 0 && mem.limit_bytes > 0);
    ct_layer *model = build_model(cfg, model_name, &err);
    ct_layer *loss = build_layer(cfg, "WeightedCategoryCrossEntropy", &err);
    ct_optimizer *opt = build_optimizer(cfg, "Adam", &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, "sequence_copy_inputs", batch_size, 1, &train, &eval, &err), &err);
    CHECK(model && loss && opt);
    ct_batch b;
    CHECK_OK(ct_stream_next(train, &b, &err), &err);
    CHECK(b.t[0].shape[1] == mem.example_length);  // the length the budget used is the stream's
    ct_device dev = ct_device_cpu();
    ct_trainer *tr = NULL;
    ct_trainer_options topts = ct_trainer_default_options();
    topts.loss_chunk_size = loss_chunk;
    CHECK_OK(ct_trainer_new(&tr, model, loss, b.t, b.n, opt, ct_key_from_seed(1), &dev, &topts, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    CHECK_MSG(mem.weights == (double)net->n_weights, "%s: planned %.0f weights, the net has %zu", what, mem.weights,
              net->n_weights);
    double on_device = mem.model_bytes - 4.0 * host_floats;
    // The device also holds the step arena, planned at construction.
    size_t slabs = dev.current_bytes - ct_trainer_memory_plan(tr)->activations;
    CHECK_MSG(on_device <= (double)slabs && on_device > (double)slabs - 64.0 * 3 * net->n_params,
              "%s: planned %.0f model bytes on the device, it holds %zu", what, on_device, slabs);
    CHECK_OK(ct_trainer_one_step(tr, b.t, ct_key_from_seed(2), 1, 1e-3f, NULL, &err), &err);
    // After the first step the arena is one block of the step's high-water
    // mark (at least 1 MiB: the sizes here are chosen to pass it).
    double arena = (double)ct_trainer_arena_bytes(tr);
    CHECK(arena > 1 << 20);
    CHECK_MSG(mem.activation_bytes > 0 && mem.activation_bytes <= arena && mem.activation_bytes >= arena / 4,
              "%s: planned %.0f activation bytes, the step's arena holds %.0f", what, mem.activation_bytes, arena);
    printf("  %s: %.0f weights; model %.0f bytes (device %zu); activations %.0f bytes (arena %.0f)\n", what,
           mem.weights, mem.model_bytes, dev.current_bytes, mem.activation_bytes, arena);
    ct_trainer_free(tr);
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_layer_free(model);
    ct_layer_free(loss);
    ct_config_free(cfg);
    return mem.activation_bytes;
}

static void check_estimate(const char *what, const char *text, const char *model_name, double host_floats,
                           int batch_size) {
    check_estimate_chunked(what, text, model_name, host_floats, batch_size, 0);
}

// The model's planned bytes against a net built for one batch of the
// inputs, exactly: the weights and a gradient slab (4 bytes a float), the
// optimizer's slot floats summed over the net's own weights (their real
// shapes, so a plan's group of a wrong shape shows with a factored
// optimizer), the state slab twice (the standard trainer keeps a copy) and
// the sinusoid table (host_floats, by hand).
static void check_model_bytes(const char *what, const char *text, const char *model_name, const char *opt_name,
                              const char *inputs, int batch_size, double host_floats) {
    ct_error err = {0};
    ct_config *cfg = parse_cfg("bytes.gin", text, &err);
    ct_config_run_shape run = {.model = model_name, .optimizer = opt_name, .inputs = inputs,
                               .batch_size = batch_size, .n_devices = 1};
    ct_config_memory mem;
    CHECK_OK(ct_config_check_memory(cfg, &run, &mem, &err), &err);
    ct_layer *model = build_model(cfg, model_name, &err);
    ct_optimizer *opt = build_optimizer(cfg, opt_name, &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, inputs, batch_size, 1, &train, &eval, &err), &err);
    ct_batch b;
    if (model && opt && train && ct_stream_next(train, &b, &err) == CT_OK) {
        ct_device dev = ct_device_cpu();
        ct_net net;
        CHECK_OK(ct_net_init(&net, model, &b.t[0], 1, ct_key_from_seed(1), &dev, &err), &err);
        double slots = 0;
        for (int i = 0; i < net.n_params; i++) slots += (double)ct_optimizer_slot_floats(opt, &net.params[i]->sig);
        double want = 4.0 * (2.0 * (double)net.n_weights + slots + host_floats) + 8.0 * (double)net.n_state;
        CHECK_MSG(mem.model_bytes == want,
                  "%s: planned %.0f model bytes, the net's %.0f (%zu weights, %.0f slot floats, %zu state)", what,
                  mem.model_bytes, want, net.n_weights, slots, net.n_state);
        // The memory-efficient trainer: no gradient slab, the state three times.
        run.memory_efficient = true;
        CHECK_OK(ct_config_check_memory(cfg, &run, &mem, &err), &err);
        want = 4.0 * ((double)net.n_weights + slots + host_floats) + 12.0 * (double)net.n_state;
        CHECK_MSG(mem.model_bytes == want, "%s (memory-efficient): planned %.0f model bytes, the net's %.0f", what,
                  mem.model_bytes, want);
        ct_net_free(&net);
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_layer_free(model);
    ct_optimizer_free(opt);
    ct_config_free(cfg);
}

#define COPY_INPUTS(len)                                                                    \
    "sequence_copy_inputs.vocab_size = 8\nsequence_copy_inputs.train_length = " #len "\n" \
    "sequence_copy_inputs.eval_min_length = 4\nsequence_copy_inputs.eval_max_length = 5\n"  \
    "sequence_copy_inputs.pad_to_multiple = 1\n"

// ct_config_check_memory on text: the status, and the message must hold
// every one of the needles.
static void expect_budget(const char *text, ct_config_run_shape run, ct_status want, const char *const *needles) {
    ct_error err = {0};
    ct_config *cfg = parse_cfg("big.gin", text, &err);
    ct_status st = ct_config_check_memory(cfg, &run, NULL, &err);
    CHECK_MSG(st == want, "got %s (%s), want %s", ct_status_name(st), err.msg, ct_status_name(want));
    for (int i = 0; needles[i]; i++) CHECK_MSG(strstr(err.msg, needles[i]), "no '%s' in: %s", needles[i], err.msg);
    if (st != CT_OK) printf("  refused: %s\n", err.msg);
    ct_config_free(cfg);
}

// The MLP's plan on IDX images takes its input width from the file's header
// (28 x 28 here): the weights it plans are the net's built on a real batch,
// and a first Dense of 2^24 units over 784 pixels (1.33e10 weights, 199 GiB
// with gradients and Adam's slots) is refused naming it, where counting the
// input as 1 wide let it through.
static void test_memory_budget_idx(void) {
    make_tmp_dir();
    write_idx(tmp_file("train-images-idx3-ubyte"), tmp_file("train-labels-idx1-ubyte"), 10, 0);
    write_idx(tmp_file("t10k-images-idx3-ubyte"), tmp_file("t10k-labels-idx1-ubyte"), 6, 5);
    // By hand: Dense(784 -> 8), (8 -> 5), (5 -> 3), kernels and biases;
    // unflattened, the first Dense is over the 28 columns at each of 28 rows.
    const struct {
        const char *flatten;
        double weights, act;  // act: one example's Dense and Relu outputs, floats
    } cases[] = {{"True", 784 * 8 + 8 + 8 * 5 + 5 + 5 * 3 + 3, 2 * (8 + 5 + 3)},
                 {"False", 28 * 8 + 8 + 8 * 5 + 5 + 5 * 3 + 3, 2 * 28 * (8 + 5 + 3)}};
    for (int c = 0; c < 2; c++) {
        for (int batcher = 0; batcher < 2; batcher++) {
            ct_error err = {0};
            char text[2048];
            if (batcher)
                snprintf(text, sizeof text,
                         "MLP.layer_widths = [8, 5, 3]\nMLP.flatten = %s\ndata_streams.dataset_name = 'mnist'\n"
                         "data_streams.data_dir = '%s'\n",
                         cases[c].flatten, tmp_dir);
            else
                snprintf(text, sizeof text,
                         "MLP.layer_widths = [8, 5, 3]\nMLP.flatten = %s\nIDXInputs.train_images = '%s'\n"
                         "IDXInputs.train_labels = '%s'\nIDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
                         cases[c].flatten, tmp_file("train-images-idx3-ubyte"), tmp_file("train-labels-idx1-ubyte"),
                         tmp_file("t10k-images-idx3-ubyte"), tmp_file("t10k-labels-idx1-ubyte"));
            const char *inputs = batcher ? "batcher" : "IDXInputs";
            ct_config *cfg = parse_cfg("mlp.gin", text, &err);
            ct_config_run_shape run = {.model = "MLP", .optimizer = "SGD", .inputs = inputs, .batch_size = 2};
            ct_config_memory mem;
            CHECK_OK(ct_config_check_memory(cfg, &run, &mem, &err), &err);
            CHECK_MSG(mem.weights == cases[c].weights, "MLP on %s, flatten %s: planned %.0f weights, by hand %.0f",
                      inputs, cases[c].flatten, mem.weights, cases[c].weights);
            CHECK_MSG(mem.activation_bytes == 4.0 * 2 * cases[c].act, "MLP on %s, flatten %s: %.0f activation bytes",
                      inputs, cases[c].flatten, mem.activation_bytes);
            ct_layer *mlp = build_model(cfg, "MLP", &err);
            ct_stream *train = NULL, *eval = NULL;
            CHECK_OK(ct_config_build_inputs(cfg, inputs, 2, 1, &train, &eval, &err), &err);
            ct_batch b;
            if (mlp && train && ct_stream_next(train, &b, &err) == CT_OK) {
                ct_device dev = ct_device_cpu();
                ct_net net;
                CHECK_OK(ct_net_init(&net, mlp, &b.t[0], 1, ct_key_from_seed(1), &dev, &err), &err);
                CHECK_MSG(mem.weights == (double)net.n_weights, "MLP: planned %.0f weights, the net has %zu",
                          mem.weights, net.n_weights);
                ct_net_free(&net);
            }
            ct_stream_free(train);
            ct_stream_free(eval);
            ct_layer_free(mlp);
            ct_config_free(cfg);
        }
    }
    char text[2048];
    snprintf(text, sizeof text,
             "MLP.layer_widths = [16777216, 10]\nIDXInputs.train_images = '%s'\nIDXInputs.train_labels = '%s'\n"
             "IDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
             tmp_file("train-images-idx3-ubyte"), tmp_file("train-labels-idx1-ubyte"),
             tmp_file("t10k-images-idx3-ubyte"), tmp_file("t10k-labels-idx1-ubyte"));
    expect_budget(text,
                  (ct_config_run_shape){.model = "MLP", .optimizer = "Adam", .inputs = "IDXInputs", .batch_size = 2},
                  CT_ERR_MEMORY,
                  (const char *[]){"big.gin:1:1: MLP.layer_widths = [16777216, 10]", "(1.33e+10 weights)", NULL});
    // SM3's slots by the weights' shapes: the plan's groups are the net's.
    snprintf(text, sizeof text, "MLP.layer_widths = [8, 5, 3]\ndata_streams.dataset_name = 'mnist'\n"
             "data_streams.data_dir = '%s'\n", tmp_dir);
    check_model_bytes("MLP", text, "MLP", "SM3", "batcher", 2, 0);
    // The batcher's batch_size_per_device, named where it is written.
    expect_budget("MLP.layer_widths = [8]\ndata_streams.dataset_name = 'mnist'\n"
                  "batcher.batch_size_per_device = 1048576\n",
                  (ct_config_run_shape){.model = "MLP", .inputs = "batcher", .batch_size = 1 << 20,
                                        .device_limit_bytes = 1 << 20},
                  CT_ERR_MEMORY,
                  (const char *[]){"big.gin:3:1: batcher.batch_size_per_device = 1048576: one step's", NULL});
    // The batcher's eval batches are eval_batch_size, not the step's: 65536
    // examples of two 8-wide outputs (Dense, Relu) need 4 MiB of
    // activations, refused under a 1 MiB limit naming eval_batch_size (a run
    // that trained, then failed at its first eval); 1024 of them fit.
    expect_budget("MLP.layer_widths = [8]\ndata_streams.dataset_name = 'mnist'\n"
                  "batcher.eval_batch_size = 65536\n",
                  (ct_config_run_shape){.model = "MLP", .inputs = "batcher", .batch_size = 2,
                                        .device_limit_bytes = 1 << 20},
                  CT_ERR_MEMORY,
                  (const char *[]){"big.gin:3:1: batcher.eval_batch_size = 65536: an eval step's activations need "
                                   "about 4.0 MiB (65536 examples)", NULL});
    expect_budget("MLP.layer_widths = [8]\ndata_streams.dataset_name = 'mnist'\n"
                  "batcher.eval_batch_size = 1024\n",
                  (ct_config_run_shape){.model = "MLP", .inputs = "batcher", .batch_size = 2,
                                        .device_limit_bytes = 1 << 20},
                  CT_OK, (const char *[]){NULL});
    // Trax's older MLP spelling is named as written, not layer_widths (which
    // the config left at its default).
    expect_budget("MLP.d_hidden = 16777216\n", (ct_config_run_shape){.model = "MLP", .optimizer = "Adam", .batch_size = 1},
                  CT_ERR_MEMORY, (const char *[]){"big.gin:1:1: MLP.d_hidden = 16777216: the model's", NULL});
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"};
    remove_tmp(names, 4);
}

static void test_memory_budget(void) {
    // The estimate against real trainers.
    check_estimate("TransformerLM (learned positions)",
                   "TransformerLM.vocab_size = 8\nTransformerLM.d_model = 16\nTransformerLM.d_ff = 32\n"
                   "TransformerLM.n_layers = 2\nTransformerLM.n_heads = 2\nTransformerLM.max_len = 16\n"
                   "TransformerLM.dropout = 0.0\nTransformerLM.learned_positions = True\n" COPY_INPUTS(5),
                   "TransformerLM", 0, 96);
    check_estimate("ReformerLM",
                   "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                   "ReformerLM.n_layers = 3\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                   "ReformerLM.dropout = 0.0\n" COPY_INPUTS(9),
                   "ReformerLM", 0, 48);  // learned positions: in the weights
    // Fixed sinusoids: a (max_len, d_model) table beside the weights, none in them.
    check_estimate("TransformerLM (fixed positions)",
                   "TransformerLM.vocab_size = 8\nTransformerLM.d_model = 16\nTransformerLM.d_ff = 32\n"
                   "TransformerLM.n_layers = 2\nTransformerLM.n_heads = 2\nTransformerLM.max_len = 16\n"
                   "TransformerLM.dropout = 0.0\nTransformerLM.fixed_positions = True\n" COPY_INPUTS(5),
                   "TransformerLM", 16 * 16, 96);
    // The model's bytes exactly, with optimizers whose slots depend on the
    // weights' shapes, and LSHSelfAttention's state (hash counters and
    // buckets, per example or per token).
    const char *reformer_lsh = "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                               "ReformerLM.n_layers = 2\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                               "ReformerLM.attention_type = [@SelfAttention, @LSHSelfAttention]\n"
                               "LSHSelfAttention.chunk_len = 6\nSelfAttention.chunk_len = 6\n" COPY_INPUTS(9);
    char bytes_text[2048];
    for (int k = 0; k < 2; k++) {
        const char *opt = k ? "Adafactor" : "SM3";
        check_model_bytes(opt, reformer_lsh, "ReformerLM", opt, "sequence_copy_inputs", 3, 0);
        snprintf(bytes_text, sizeof bytes_text, "%sLSHSelfAttention.max_length_for_buckets = 24\n", reformer_lsh);
        check_model_bytes(opt, bytes_text, "ReformerLM", opt, "sequence_copy_inputs", 3, 0);
        check_model_bytes(opt,
                          "TransformerLM.vocab_size = 8\nTransformerLM.d_model = 16\nTransformerLM.d_ff = 32\n"
                          "TransformerLM.n_layers = 2\nTransformerLM.n_heads = 2\nTransformerLM.max_len = 16\n"
                          "TransformerLM.learned_positions = True\n" COPY_INPUTS(5),
                          "TransformerLM", opt, "sequence_copy_inputs", 2, 0);
        check_model_bytes(opt, "RNNLM.vocab_size = 8\nRNNLM.d_model = 16\nRNNLM.rnn_cell = @LSTMCell\n" COPY_INPUTS(5),
                          "RNNLM", opt, "sequence_copy_inputs", 2, 0);
        // An embedding of 2^20 floats (65536 x 16): its slots count too.
        check_model_bytes(opt,
                          "RNNLM.vocab_size = 65536\nRNNLM.d_model = 16\nRNNLM.n_layers = 1\n"
                          "RNNLM.rnn_cell = @LSTMCell\n" COPY_INPUTS(5),
                          "RNNLM", opt, "sequence_copy_inputs", 2, 0);
    }
    // The length the budget plans with is the inputs' own: addition_inputs'
    // batches (the stream's), TextInputs' seq_len tokens.
    {
        ct_error err = {0};
        ct_config *cfg = parse_cfg("len.gin",
                                     "TransformerLM.vocab_size = 16\nTransformerLM.d_model = 16\n"
                                     "TransformerLM.d_ff = 32\n"
                                     "TransformerLM.n_layers = 1\nTransformerLM.n_heads = 2\n"
                                     "addition_inputs.vocab_size = 13\naddition_inputs.train_length = 5\n"
                                     "addition_inputs.eval_min_length = 6\naddition_inputs.eval_max_length = 8\n"
                                     "addition_inputs.pad_to_multiple = 1\nTextInputs.paths = ['x']\n"
                                     "TextInputs.seq_len = 7\n",
                                     &err);
        ct_config_run_shape r = {.model = "TransformerLM", .inputs = "addition_inputs", .batch_size = 2};
        ct_config_memory mem;
        CHECK_OK(ct_config_check_memory(cfg, &r, &mem, &err), &err);
        ct_stream *train = NULL, *eval = NULL;
        CHECK_OK(ct_config_build_inputs(cfg, "addition_inputs", 2, 1, &train, &eval, &err), &err);
        ct_batch b;
        if (train && ct_stream_next(train, &b, &err) == CT_OK)
            CHECK_MSG(b.t[0].shape[1] == mem.example_length, "addition: planned %lld tokens, the stream's %lld",
                      (long long)mem.example_length, (long long)b.t[0].shape[1]);
        ct_stream_free(train);
        ct_stream_free(eval);
        r.inputs = "TextInputs";
        CHECK_OK(ct_config_check_memory(cfg, &r, &mem, &err), &err);
        CHECK_MSG(mem.example_length == 7, "TextInputs: planned %lld tokens", (long long)mem.example_length);
        ct_config_free(cfg);
    }
    // MLP: its plan counts the input width as 1 (the data decide it).
    {
        ct_error err = {0};
        ct_config *cfg = parse_cfg("mlp.gin", "MLP.layer_widths = [8, 5, 3]\n", &err);
        ct_config_run_shape run = {.model = "MLP", .optimizer = "SGD", .batch_size = 2};
        ct_config_memory mem;
        CHECK_OK(ct_config_check_memory(cfg, &run, &mem, &err), &err);
        ct_layer *mlp = build_model(cfg, "MLP", &err);
        CHECK(mlp != NULL);
        float x[2] = {0};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_F32, 2, 1, x);
        ct_device dev = ct_device_cpu();
        ct_net net;
        CHECK_OK(ct_net_init(&net, mlp, &in, 1, ct_key_from_seed(1), &dev, &err), &err);
        CHECK_MSG(mem.weights == (double)net.n_weights, "MLP: planned %.0f weights, the net has %zu", mem.weights,
                  net.n_weights);
        ct_net_free(&net);
        ct_layer_free(mlp);
        ct_config_free(cfg);
    }

    // Runs that cannot fit, refused from the settings, naming the setting
    // that makes them big, where it is bound, and the bytes.
    const char *tlm = "train.model = @TransformerLM\nTransformerLM.vocab_size = 8\nTransformerLM.d_model = 16\n"
                      "TransformerLM.d_ff = 32\nTransformerLM.n_layers = 2\nTransformerLM.n_heads = 2\n"
                      "TransformerLM.max_len = 16\n" COPY_INPUTS(5);
    ct_config_run_shape run = {.model = "TransformerLM", .optimizer = "Adam", .inputs = "sequence_copy_inputs",
                               .batch_size = 4};
    char text[2048];
    {
        ct_error err = {0};
        ct_config *cfg = parse_cfg("big.gin", tlm, &err);
        ct_config_memory m1, m2;
        // Each local device holds a gradient slab: a second device adds one,
        // 4 bytes a weight (a TransformerLM has no state to grow with it).
        ct_config_run_shape r = run;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m1, &err), &err);
        r.n_devices = 2;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m2, &err), &err);
        CHECK_MSG(m2.model_bytes - m1.model_bytes == 4.0 * m1.weights, "%.0f - %.0f bytes, %.0f weights",
                  m2.model_bytes, m1.model_bytes, m1.weights);
        // The chunked loss holds one chunk of logits per device: 8 rows of
        // 2 x vocab_size floats (logits and their log-softmax) each, so the
        // second device adds 4 x 2 x 8 x 8 = 512 bytes (4 x 10 rows on one
        // device, 2 x 10 on each of two: both over the chunk).
        r.loss_chunk_size = 8;
        r.n_devices = 1;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m1, &err), &err);
        r.n_devices = 2;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m2, &err), &err);
        CHECK_MSG(m2.activation_bytes - m1.activation_bytes == 512.0, "%.0f - %.0f", m2.activation_bytes,
                  m1.activation_bytes);
        // The memory-efficient trainer keeps the model in host memory: a
        // device with room for the activations and half the model is enough
        // for it, not for the standard trainer.
        r = run;
        r.batch_size = 1;
        // A chunk past a device's rows (4 examples x 10 tokens) holds them all:
        // the same as no chunking.
        r.loss_chunk_size = 0;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m1, &err), &err);
        r.loss_chunk_size = 1 << 20;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m2, &err), &err);
        CHECK_MSG(m1.activation_bytes == m2.activation_bytes, "unchunked %.0f, a chunk of 2^20 rows %.0f",
                  m1.activation_bytes, m2.activation_bytes);
        r.loss_chunk_size = 0;
        r.memory_efficient = true;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m1, &err), &err);
        CHECK(m1.model_bytes > 2 * m1.activation_bytes);  // the limit below is under the model's bytes
        r.device_limit_bytes = (size_t)(m1.activation_bytes + m1.model_bytes / 2);
        CHECK_OK(ct_config_check_memory(cfg, &r, &m2, &err), &err);
        r.memory_efficient = false;
        CHECK(ct_config_check_memory(cfg, &r, &m2, &err) == CT_ERR_MEMORY && strstr(err.msg, "the device's limit"));
        ct_config_free(cfg);
        // A process holds the state slab for its share of the batch: 8
        // examples over 2 processes need what 4 on one do (LSHSelfAttention
        // stores its buckets per example of max_length_for_buckets).
        cfg = parse_cfg("r.gin",
                          "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                          "ReformerLM.n_layers = 2\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                          "ReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.chunk_len = 6\n"
                          "LSHSelfAttention.max_length_for_buckets = 24\n" COPY_INPUTS(9),
                          &err);
        r = (ct_config_run_shape){.model = "ReformerLM", .optimizer = "Adam", .inputs = "sequence_copy_inputs",
                                  .batch_size = 4};
        CHECK_OK(ct_config_check_memory(cfg, &r, &m1, &err), &err);
        r.batch_size = 8;
        r.n_processes = 2;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m2, &err), &err);
        CHECK_MSG(m1.model_bytes == m2.model_bytes, "%.0f, %.0f", m1.model_bytes, m2.model_bytes);
        ct_config_free(cfg);
        // A ReformerLM of no layers keeps no block's activations, with either trainer.
        cfg = parse_cfg("r0.gin",
                          "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                          "ReformerLM.n_layers = 0\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n" COPY_INPUTS(9),
                          &err);
        r = (ct_config_run_shape){.model = "ReformerLM", .inputs = "sequence_copy_inputs", .batch_size = 2};
        CHECK_OK(ct_config_check_memory(cfg, &r, &m1, &err), &err);
        r.memory_efficient = true;
        CHECK_OK(ct_config_check_memory(cfg, &r, &m2, &err), &err);
        // By hand: the embedding and the final layers' 6 d_model + 2 vocab_size
        // floats a token, 18 tokens, 2 examples: (96 + 16) x 18 x 2 x 4 bytes.
        CHECK_MSG(m1.activation_bytes == 16128.0, "%.0f activation bytes for no layers", m1.activation_bytes);
        CHECK_MSG(m1.activation_bytes > 0 && m1.activation_bytes == m2.activation_bytes, "%.0f, %.0f",
                  m1.activation_bytes, m2.activation_bytes);
        ct_config_free(cfg);
    }
    // Rows at the edge of the BLAS's int: 2^24 examples x 128 tokens = 2^31 rows.
    {
        ct_config_run_shape r = run;
        r.batch_size = 1 << 24;
        snprintf(text, sizeof text, "%ssequence_copy_inputs.train_length = 64\n", tlm);
        expect_budget(text, r, CT_ERR_ARG, (const char *[]){"a device's share of the batch is 2147483648 rows", NULL});
        // Evals at their own length (copy eval w up to 2^20 - 1 tokens: 2^21
        // per example): refused now, not at the first eval.
        r.batch_size = 1024;
        snprintf(text, sizeof text, "%ssequence_copy_inputs.eval_max_length = 1048576\n", tlm);
        expect_budget(text, r, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:13:1: sequence_copy_inputs.eval_max_length = 1048576: an eval step's "
                                       "activations need about",
                                       "(1024 x 2097152 tokens)", NULL});
        // Rows split over devices and processes: 8 on 2 devices x 3 processes do not.
        r.batch_size = 8;
        r.n_devices = 2;
        r.n_processes = 3;
        expect_budget(tlm, r, CT_ERR_ARG, (const char *[]){"make it a multiple of 6", NULL});
    }
    // A batch size set on the inputs (as Trax's configs set it, per
    // process) is named where it is written, not as train.batch_size.
    {
        ct_config_run_shape r = run;
        r.batch_size = 1 << 20;
        r.device_limit_bytes = (size_t)1 << 30;
        snprintf(text, sizeof text, "%ssequence_copy_inputs.batch_size = 1048576\n", tlm);
        expect_budget(text, r, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:13:1: sequence_copy_inputs.batch_size = 1048576: one step's "
                                       "activations need about",
                                       NULL});
        r.batch_size = 1 << 21;
        r.n_processes = 2;
        expect_budget(text, r, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:13:1: sequence_copy_inputs.batch_size = 1048576 (a step's batch of "
                                       "2097152): one step's activations",
                                       NULL});
    }
    // LSHSelfAttention's stored buckets (the state slab) grow with the batch
    // and, per example, with max_length_for_buckets or the length: by hand,
    // n_heads 2 x n_hashes 1 x n_layers 2 = 4 floats a token, kept twice,
    // 32 bytes: 2^20 examples of 18 tokens are 576 MiB, one example of
    // max_length_for_buckets 2^30 32 GiB, one of 2^21 + 2 tokens 64 MiB.
    // Each is refused naming its setting, not the model's.
    {
        const char *lsh = "train.model = @ReformerLM\nReformerLM.vocab_size = 8\nReformerLM.d_model = 16\n"
                          "ReformerLM.d_ff = 32\nReformerLM.n_layers = 2\nReformerLM.n_heads = 2\n"
                          "ReformerLM.max_len = 18\nReformerLM.attention_type = @LSHSelfAttention\n"
                          "LSHSelfAttention.chunk_len = 6\n" COPY_INPUTS(9);
        ct_config_run_shape r = {.model = "ReformerLM", .optimizer = "Adam", .inputs = "sequence_copy_inputs",
                                 .batch_size = 1 << 20, .device_limit_bytes = (size_t)256 << 20};
        snprintf(text, sizeof text, "%strain.batch_size = 1048576\n", lsh);
        expect_budget(text, r, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:15:1: train.batch_size = 1048576: the state slab",
                                       "1048576 examples of 18 tokens needs about 576.0 MiB",
                                       "the device's limit is 256.0 MiB", NULL});
        r.batch_size = 4;
        snprintf(text, sizeof text, "%sLSHSelfAttention.max_length_for_buckets = 1073741824\n", lsh);
        expect_budget(text, r, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:15:1: LSHSelfAttention.max_length_for_buckets = 1073741824: the state "
                                       "slab", "needs about 128.0 GiB", NULL});
        r.batch_size = 1;
        r.device_limit_bytes = (size_t)32 << 20;
        snprintf(text, sizeof text, "%ssequence_copy_inputs.train_length = 1048576\n", lsh);
        expect_budget(text, r, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:15:1: sequence_copy_inputs.train_length = 1048576: the state slab",
                                       "1 example of 2097152 tokens needs about 64.0 MiB", NULL});
    }
    // Fixed sinusoids (ctrax's fixed_positions) are a table beside the weights.
    snprintf(text, sizeof text, "%sTransformerLM.n_layers = 100000000\nTransformerLM.fixed_positions = True\n", tlm);
    expect_budget(text, run, CT_ERR_MEMORY,
                  (const char *[]){"big.gin:13:1: TransformerLM.n_layers = 100000000",
                                   "weights, gradients, optimizer slots and positional table need about",
                                   "TiB (2.22e+11 weights)", "this machine has", NULL});
    snprintf(text, sizeof text, "%sTransformerLM.n_layers = 100000000\nTransformerLM.learned_positions = True\n",
             tlm);
    expect_budget(text, run, CT_ERR_MEMORY,
                  (const char *[]){"weights, gradients and optimizer slots need about", NULL});
    // The memory-efficient trainer keeps no gradient slab.
    run.memory_efficient = true;
    expect_budget(text, run, CT_ERR_MEMORY, (const char *[]){"the model's weights and optimizer slots need", NULL});
    run.memory_efficient = false;
    // d_model is what makes this one big, not the (bound) n_layers.
    snprintf(text, sizeof text, "%sTransformerLM.d_model = 4000000\nTransformerLM.n_heads = 1\n", tlm);
    expect_budget(text, run, CT_ERR_MEMORY, (const char *[]){"big.gin:13:1: TransformerLM.d_model = 4000000", NULL});
    snprintf(text, sizeof text, "%sTransformerLM.max_len = 2147483647\nTransformerLM.fixed_positions = True\n", tlm);
    expect_budget(text, run, CT_ERR_MEMORY,
                  (const char *[]){"TransformerLM.max_len = 2147483647", "positional table alone 128.0 GiB", NULL});
    // RNNLM's (2 d_model, 4 d_model) kernels with d_model 2^31 - 1 pass 2^63
    // floats: refused by their weights, their optimizer slots not counted
    // (counting them overflowed an int64: UB, an abort under UBSan).
    {
        ct_config_run_shape rnn = {.model = "RNNLM", .optimizer = "Adam", .batch_size = 4};
        expect_budget("RNNLM.d_model = 2147483647\nRNNLM.rnn_cell = 'LSTMCell'\n", rnn, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:1:1: RNNLM.d_model = 2147483647", NULL});
        expect_budget("RNNLM.d_model = 2147483647\nRNNLM.rnn_cell = 'GRUCell'\nRNNLM.rnn_cell_d_state_multiplier = 1\n",
                      rnn, CT_ERR_MEMORY,
                      (const char *[]){"big.gin:1:1: RNNLM.d_model = 2147483647", NULL});
    }
    // A batch: its activations (B x T tokens).
    snprintf(text, sizeof text, "%strain.batch_size = 16777216\n", tlm);
    run.batch_size = 16777216;
    expect_budget(text, run, CT_ERR_MEMORY,
                  (const char *[]){"big.gin:13:1: train.batch_size = 16777216", "one step's activations need about",
                                   "(16777216 x 10 tokens)", NULL});
    // Processes split the batch: each holds its share.
    run.n_processes = 1 << 20;
    expect_budget(text, run, CT_OK, (const char *[]){NULL});
    run.n_processes = 0;
    // An example too long for memory on its own (2 x 10^6 tokens of a wide
    // model: activations grow linearly with T, about 130 KB per token).
    snprintf(text, sizeof text,
             "train.model = @TransformerLM\nTransformerLM.vocab_size = 8\nTransformerLM.d_model = 1024\n"
             "TransformerLM.d_ff = 4096\nTransformerLM.n_layers = 2\nTransformerLM.n_heads = 2\n"
             "TransformerLM.max_len = 16\n" COPY_INPUTS(5) "sequence_copy_inputs.train_length = 1000000\n");
    run.batch_size = 1;
    expect_budget(text, run, CT_ERR_MEMORY,
                  (const char *[]){"big.gin:13:1: sequence_copy_inputs.train_length = 1000000", "one example's", NULL});
    // Rows of a matrix product past the BLAS's int: 2^24 x 256 tokens; over
    // 4 devices each has 2^30 rows, which the BLAS takes (then memory says no).
    snprintf(text, sizeof text, "%ssequence_copy_inputs.train_length = 128\n", tlm);
    run.batch_size = 1 << 24;
    expect_budget(text, run, CT_ERR_ARG,
                  (const char *[]){"train.batch_size = 16777216: a device's share", "BLAS", NULL});
    run.n_devices = 4;
    expect_budget(text, run, CT_ERR_MEMORY, (const char *[]){"16777216 x 256 tokens", NULL});
    run.n_devices = 1;
    // The device's limit, when smaller than the machine.
    run.batch_size = 4;
    run.device_limit_bytes = 4096;
    expect_budget(tlm, run, CT_ERR_MEMORY, (const char *[]){"the device's limit is 4.0 KiB", NULL});
    run.device_limit_bytes = 0;
    expect_budget(tlm, run, CT_OK, (const char *[]){NULL});
    // A batch that does not split into equal rows over the devices and
    // processes, refused naming the settings (the trainer said so at the
    // first step, naming none).
    snprintf(text, sizeof text, "%strain.batch_size = 30\ntrain.n_devices = 4\n", tlm);
    run.batch_size = 30;
    run.n_devices = 4;
    expect_budget(text, run, CT_ERR_ARG,
                  (const char *[]){"big.gin:13:1: train.batch_size = 30 does not split into equal rows over "
                                   "big.gin:14:1: train.n_devices = 4: make it a multiple of 4",
                                   NULL});
    run.batch_size = 28;
    expect_budget(text, run, CT_OK, (const char *[]){NULL});
    run.n_devices = 2;
    run.n_processes = 3;
    run.batch_size = 9;
    expect_budget(tlm, run, CT_ERR_ARG,
                  (const char *[]){"train.n_devices = 2 x train.n_processes = 3: make it a multiple of 6", NULL});
    run.batch_size = 12;
    expect_budget(tlm, run, CT_OK, (const char *[]){NULL});
    run.n_devices = 1;
    run.n_processes = 0;
    run.batch_size = 4;

    // Layer counts the constructors keep in a C int.
    snprintf(text, sizeof text, "%sTransformerLM.n_layers = 2147483647\n", tlm);
    expect_budget(text, run, CT_ERR_ARG,
                  (const char *[]){"big.gin:13:1: TransformerLM.n_layers = 2147483647", "C int", NULL});
    // At the edge (n_layers + 7 = INT_MAX) the count fits: the memory refuses it.
    snprintf(text, sizeof text, "%sTransformerLM.n_layers = 2147483640\n", tlm);
    expect_budget(text, run, CT_ERR_MEMORY,
                  (const char *[]){"big.gin:13:1: TransformerLM.n_layers = 2147483640: the model's weights", NULL});
    expect_budget("ReformerLM.n_layers = 536870912\n", (ct_config_run_shape){.model = "ReformerLM", .batch_size = 1},
                  CT_ERR_ARG,
                  (const char *[]){"big.gin:1:1: ReformerLM.n_layers = 536870912: its 4 x n_layers layers", NULL});

    // The builder refuses a model whose weights and gradients cannot fit, before
    // building a layer of it (10^8 blocks would take minutes and gigabytes).
    {
        ct_error err = {0};
        ct_config *cfg = parse_cfg("big.gin", "ReformerLM.n_layers = 100000000\n", &err);
        ct_layer *m = build_model(cfg, "ReformerLM", &err);
        CHECK(m == NULL && err.code == CT_ERR_MEMORY);
        CHECK_MSG(strstr(err.msg, "big.gin:1:1: ReformerLM.n_layers = 100000000: the model's weights"), "%s", err.msg);
        if (m) ct_layer_free(m);
        ct_config_free(cfg);
        // ct_net_init allocates a gradient slab beside the weights: an MLP
        // whose weights take 70% of the machine fits alone, not with its
        // gradients (140%), and is refused by the builder, naming its widths
        // (it passed, to fail at ct_net_init naming no setting). Weights
        // (input width 1, from below): (1 x a + a) + (a x b + b).
        double machine = (double)ct_machine_memory_bytes(), a = 1 << 24;
        double b = floor(0.7 * machine / (4.0 * (a + 1)));
        CHECK(b >= 1 && b <= a);
        double weights = 2 * a + a * b + b;
        CHECK(4 * weights < machine && 8 * weights > machine);
        char text2[128];
        snprintf(text2, sizeof text2, "MLP.layer_widths = [16777216, %.0f]\n", b);
        cfg = parse_cfg("big.gin", text2, &err);
        m = build_model(cfg, "MLP", &err);
        CHECK_MSG(m == NULL && err.code == CT_ERR_MEMORY &&
                      strstr(err.msg, "big.gin:1:1: MLP.layer_widths = [16777216, ") &&
                      strstr(err.msg, "the model's weights and gradients need"),
                  "%s", m ? "built" : err.msg);
        printf("  error: %s\n", err.msg);
        if (m) ct_layer_free(m);
        ct_config_free(cfg);
    }

    // The library: a net's slabs are refused before any is allocated.
    {
        ct_error err = {0};
        ct_device dev = ct_device_cpu();
        ct_net net;
        float x[64] = {0};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_F32, 1, 64, x);
        ct_layer *huge = ct_dense(1 << 30);  // 65 x 2^30 weights: 520 GiB of slabs
        ct_status st = ct_net_init(&net, huge, &in, 1, ct_key_from_seed(1), &dev, &err);
        CHECK_MSG(st == CT_ERR_MEMORY && strstr(err.msg, "model Dense") && strstr(err.msg, "520.0 GiB") &&
                      strstr(err.msg, "this machine has"),
                  "%s", err.msg);
        CHECK(dev.n_allocs == 0 && dev.current_bytes == 0);
        printf("  ct_net_init: %s\n", err.msg);
        ct_layer *small = ct_dense(64);
        dev.limit_bytes = 1000;
        st = ct_net_init(&net, small, &in, 1, ct_key_from_seed(1), &dev, &err);
        CHECK_MSG(st == CT_ERR_MEMORY && strstr(err.msg, "device memory limit") && strstr(err.msg, "model Dense"),
                  "%s", err.msg);
        CHECK(dev.n_allocs == 0 && dev.current_bytes == 0);
        dev.limit_bytes = 0;
        CHECK_OK(ct_net_init(&net, small, &in, 1, ct_key_from_seed(1), &dev, &err), &err);  // the tree is free again
        ct_net_free(&net);
        ct_layer_free(small);
        ct_layer_free(huge);

        // A device allocation above the machine's memory, before malloc.
        uint64_t allocs = dev.n_allocs;
        size_t machine = ct_machine_memory_bytes();
        CHECK(machine > 0 && ct_machine_available_bytes() <= machine);
        void *p = NULL;
        st = ct_device_alloc(&dev, machine + 1, "a huge buffer", &p, &err);
        CHECK_MSG(st == CT_ERR_MEMORY && p == NULL && strstr(err.msg, "a huge buffer") &&
                      strstr(err.msg, "this machine has"),
                  "%s", err.msg);
        st = ct_device_alloc(&dev, SIZE_MAX, "everything", &p, &err);
        CHECK(st == CT_ERR_MEMORY && p == NULL);
        CHECK(dev.n_allocs == allocs && dev.current_bytes == 0);
    }
    char b[32];
    CHECK(!strcmp(ct_format_bytes(812, b, sizeof b), "812 B"));
    CHECK(!strcmp(ct_format_bytes(1536, b, sizeof b), "1.5 KiB"));
    CHECK(!strcmp(ct_format_bytes(12.3 * 1099511627776.0, b, sizeof b), "12.3 TiB"));
    CHECK(!strcmp(ct_format_bytes(1e300, b, sizeof b), "8.27e+275 YiB"));
}

// train.skip_nonfinite_steps: registered (bool, default False, documented).
static void test_skip_nonfinite_setting(void) {
    char *reg = ct_config_registry_text();
    CHECK_MSG(strstr(reg, "train.skip_nonfinite_steps = False  # a bool; skip a step whose loss or gradients are "
                          "NaN/Inf and count it, instead of stopping"),
              "registry text lacks train.skip_nonfinite_steps");
    ct_free(reg);
    ct_error err = {0};
    ct_config *cfg = parse_cfg("s.gin", "train.skip_nonfinite_steps = True\n", &err);
    bool skip = false;
    CHECK_OK(ct_config_get_bool(cfg, "train", "skip_nonfinite_steps", false, &skip, &err), &err);
    CHECK(skip);
    ct_config_free(cfg);
    cfg = ct_config_new();
    const char *bad = "train.skip_nonfinite_steps = 1\n";
    CHECK(ct_config_parse_text(cfg, bad, strlen(bad), "s.gin", &err) == CT_ERR_ARG && strstr(err.msg, "s.gin:1"));
    ct_config_free(cfg);
}

// The program's settings come from one list each: ct_config_read_train
// gives the list's defaults when nothing is bound, reads every bound one,
// and queries every train.* / Loop.* parameter the registry accepts (so a
// setting that is accepted is read: none is left unused).
static void test_settings_lists(void) {
    ct_error err;
    ct_config *cfg = ct_config_new();
    ct_train_settings t, d = ct_train_default_settings();
    ct_loop_settings l;
    CHECK_OK(ct_config_read_train(cfg, &t, &err), &err);
    CHECK_OK(ct_config_read_loop(cfg, &l, &err), &err);
    CHECK(t.steps == 1000 && t.batch_size == 32 && t.eval_steps == 10 && t.keep_checkpoints == 2);
    // Trax's trainer_lib.train defaults: Adafactor, 1000 steps, evals of 10
    // batches every 100 steps, a checkpoint at every eval.
    CHECK(!strcmp(t.optimizer, "Adafactor") && !strcmp(t.loss_fn, "WeightedCategoryCrossEntropy") && !t.model);
    CHECK(t.eval_frequency == 100 && t.permanent_checkpoint_frequency == 0);
    CHECK(t.steps == d.steps && t.n_devices == d.n_devices && t.clip_grad_norm == d.clip_grad_norm);
    CHECK(l.n_steps_per_checkpoint == 100 && l.n_steps_per_permanent_checkpoint == 0);
    ct_config_free(cfg);

    cfg = ct_config_new();
    const char *text = "train.steps = 7\ntrain.optimizer = @trax.optimizers.SM3\ntrain.random_seed = None\n"
                       "train.permanent_checkpoint_frequency = 5\ntrain.checkpoint_highest = 'accuracy'\n"
                       "Loop.n_steps_per_checkpoint = 3\ntrain.clip_grad_norm = 0.5\n";
    CHECK_OK(ct_config_parse_text(cfg, text, strlen(text), "s.gin", &err), &err);
    CHECK_OK(ct_config_validate(cfg, &err), &err);
    CHECK_OK(ct_config_read_train(cfg, &t, &err), &err);
    CHECK_OK(ct_config_read_loop(cfg, &l, &err), &err);
    CHECK(t.steps == 7 && !strcmp(t.optimizer, "SM3") && t.random_seed == 0 && t.clip_grad_norm == 0.5);
    CHECK(t.permanent_checkpoint_frequency == 5 && !strcmp(t.checkpoint_highest, "accuracy"));
    CHECK(l.n_steps_per_checkpoint == 3);
    for (int i = 0; i < ct_config_n_bindings(cfg); i++) {
        ct_config_binding_info b = ct_config_binding_at(cfg, i);
        CHECK_MSG(b.used, "%s.%s is bound and not read", b.name, b.param);
    }
    // The operative config holds every registered setting and parses back;
    // lists are read by the program itself (ctrax train), not here:
    // train.metrics and the step lists.
    char *op = ct_config_operative_text(cfg), *reg = ct_config_registry_text();
    int n_settings = 0;
    for (const char *line = reg; line; line = strchr(line, '\n'), line = line ? line + 1 : NULL) {
        if (strncmp(line, "train.", 6) && strncmp(line, "Loop.", 5)) continue;
        char key[128];
        snprintf(key, sizeof key, "\n%.*s = ", (int)strcspn(line, " "), line);
        bool list = !strncmp(key, "\ntrain.metrics ", 15) || strstr(key, "checkpoints_at ") ||
                    !strcmp(key, "\nLoop.eval_at = ");
        if (!list) CHECK_MSG(strstr(op, key) != NULL, "%s is not in the operative config", key + 1);
        n_settings++;
    }
    CHECK(n_settings >= 20);
    ct_config *back = ct_config_new();
    CHECK_OK(ct_config_parse_text(back, op, strlen(op), "operative.gin", &err), &err);
    CHECK_OK(ct_config_validate(back, &err), &err);
    ct_config_free(back);
    ct_free(op);
    ct_free(reg);
    ct_config_free(cfg);
}

// ---- ReformerLM's Trax parameters ---------------------------------------------------------------

static const char REFORMER_SMALL[] = "ReformerLM.vocab_size = 7\nReformerLM.d_model = 8\nReformerLM.d_ff = 12\n"
                                     "ReformerLM.n_layers = 1\nReformerLM.n_heads = 2\nReformerLM.max_len = 16\n";

// The model text builds from REFORMER_SMALL plus extra (line 7 on); with
// param_path, that weight exists in a net for (2, 6) tokens.
static void expect_reformer(const char *extra, const char *param_path) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", REFORMER_SMALL, extra);
    ct_error err = {0};
    ct_config *cfg = parse_cfg("r.gin", text, &err);
    ct_layer *m = build_model(cfg, "ReformerLM", &err);
    CHECK_MSG(m != NULL, "%s: %s", extra, err.msg);
    if (m && param_path) {
        int32_t tokens[12] = {0};
        ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 2, 6, tokens), sig = ct_tensor_sig(&in);
        ct_device dev = ct_device_cpu();
        ct_net net;
        CHECK_OK(ct_net_init(&net, m, &sig, 1, ct_key_from_seed(1), &dev, &err), &err);
        CHECK_MSG(ct_net_find_param(&net, param_path) != NULL, "%s: no %s", extra, param_path);
        ct_net_free(&net);
    }
    if (m) ct_layer_free(m);
    ct_config_free(cfg);
}

// extra (line 7) is refused when the model is built, with every needle in
// the message.
static void expect_reformer_refused(const char *extra, const char *const *needles) {
    char text[1024];
    snprintf(text, sizeof text, "%s%s", REFORMER_SMALL, extra);
    ct_error err = {0};
    ct_config *cfg = parse_cfg("r.gin", text, &err);
    ct_layer *m = build_model(cfg, "ReformerLM", &err);
    CHECK_MSG(m == NULL && err.code == CT_ERR_ARG, "%s: built", extra);
    for (int i = 0; needles[i]; i++) CHECK_MSG(strstr(err.msg, needles[i]), "'%s' not in: %s", needles[i], err.msg);
    printf("  error: %s\n", err.msg);
    if (m) ct_layer_free(m);
    ct_config_free(cfg);
}
#define EXPECT_REFORMER_REFUSED(extra, ...) expect_reformer_refused(extra, (const char *const[]){__VA_ARGS__, NULL})

static void test_reformer_options(void) {
    // The plan of its options (budget.c): SelfAttention's per-head weights and no T x T, a chunked
    // feed-forward, fixed-base positions (weights, no table).
    check_estimate("ReformerLM(SelfAttention chunk_len 6, dk 4, dv 8; ff_chunk_size 64; fixed-base)",
                   "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                   "ReformerLM.n_layers = 3\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                   "ReformerLM.dropout = 0.0\nReformerLM.attention_type = @SelfAttention\n"
                   "SelfAttention.chunk_len = 6\nSelfAttention.n_chunks_before = 1\n"
                   "ReformerLM.d_attention_key = 4\nReformerLM.d_attention_value = 8\n"
                   "ReformerLM.ff_chunk_size = 64\nReformerLM.pos_type = 'fixed-base'\n" COPY_INPUTS(9),
                   "ReformerLM", 0, 48);
    check_estimate("ReformerLM(SelfAttention full, share_qk; pos_type 'no')",
                   "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                   "ReformerLM.n_layers = 3\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                   "ReformerLM.dropout = 0.0\nReformerLM.attention_type = @SelfAttention\n"
                   "SelfAttention.share_qk = True\nReformerLM.pos_type = 'no'\n" COPY_INPUTS(9),
                   "ReformerLM", 0, 48);
    check_estimate("ReformerLM(LSHSelfAttention chunk_len 6, 2 hashes; [@LSH, @Causal])",
                   "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                   "ReformerLM.n_layers = 2\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                   "ReformerLM.dropout = 0.0\nReformerLM.attention_type = [@LSHSelfAttention, @CausalAttention]\n"
                   "LSHSelfAttention.chunk_len = 6\nLSHSelfAttention.n_hashes = 2\n"
                   "ReformerLM.d_attention_key = 8\n" COPY_INPUTS(9),
                   "ReformerLM", 0, 48);  // learned positions: in the weights
    check_estimate("ReformerLM(ff_use_sru 2: SRU feed-forwards)",
                   "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                   "ReformerLM.n_layers = 2\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                   "ReformerLM.dropout = 0.0\nReformerLM.ff_use_sru = 2\n" COPY_INPUTS(9),
                   "ReformerLM", 0, 48);  // learned positions: in the weights
    // Axial positions: a (3, 8) and a (6, 8) table, whose product is the
    // length (18); LSH's stored buckets sized by max_length_for_buckets (the
    // state slab, per example).
    check_estimate("ReformerLM(axial (3, 6) x (8, 8); LSH max_length_for_buckets 24)",
                   "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                   "ReformerLM.n_layers = 2\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                   "ReformerLM.dropout = 0.0\nReformerLM.attention_type = @LSHSelfAttention\n"
                   "LSHSelfAttention.chunk_len = 6\nLSHSelfAttention.max_length_for_buckets = 24\n"
                   "ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (3, 6)\n"
                   "ReformerLM.pos_d_axial_embs = (8, 8)\n" COPY_INPUTS(9),
                   "ReformerLM", 0, 48);
    check_estimate("ReformerLM(LSHSelfAttention only: linear memory)",
                   "ReformerLM.vocab_size = 8\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\n"
                   "ReformerLM.n_layers = 2\nReformerLM.n_heads = 2\nReformerLM.max_len = 18\n"
                   "ReformerLM.dropout = 0.0\nReformerLM.attention_type = @LSHSelfAttention\n"
                   "LSHSelfAttention.chunk_len = 6\nReformerLM.pos_type = 'no'\n" COPY_INPUTS(9),
                   "ReformerLM", 0, 48);
    // Logits that dominate (vocab 256, 864 rows): chunked, the estimate
    // counts one chunk of them, and stays below what the chunked step holds.
#define WIDE_VOCAB                                                                                              \
    "ReformerLM.vocab_size = 256\nReformerLM.d_model = 16\nReformerLM.d_ff = 32\nReformerLM.n_layers = 2\n" \
    "ReformerLM.n_heads = 2\nReformerLM.max_len = 18\nReformerLM.dropout = 0.0\n"                           \
    "ReformerLM.pos_type = 'no'\nReformerLM.d_attention_key = 8\nReformerLM.d_attention_value = 8\n"        \
    "sequence_copy_inputs.vocab_size = 256\n"                                                                \
    "sequence_copy_inputs.train_length = 9\nsequence_copy_inputs.eval_min_length = 4\n"                      \
    "sequence_copy_inputs.eval_max_length = 5\nsequence_copy_inputs.pad_to_multiple = 1\n"
    double whole = check_estimate_chunked("ReformerLM(vocab 256)", WIDE_VOCAB, "ReformerLM", 0, 48, 0);
    double chunked = check_estimate_chunked("ReformerLM(vocab 256; loss_chunk_size 64)", WIDE_VOCAB, "ReformerLM",
                                            0, 48, 64);
#undef WIDE_VOCAB
    CHECK_MSG(chunked < 0.7 * whole, "chunked loss: %.0f activation bytes planned, unchunked %.0f", chunked, whole);
    expect_reformer("ReformerLM.attention_type = @SelfAttention\nSelfAttention.chunk_len = 2\n"
                    "SelfAttention.n_chunks_before = 1\nReformerLM.d_attention_key = 3\n",
                    "ReformerLM/ReversibleSerial[5]/ReversibleHalfResidualAttn[0]/Serial[0]/SelfAttention[1]/Wq[1]");
    expect_reformer("ReformerLM.ff_activation = 'Relu'\nReformerLM.ff_chunk_size = 4\nReformerLM.pos_type = 'no'\n",
                    "ReformerLM/ReversibleSerial[4]/ReversibleHalfResidualFF[2]/Serial[0]/Chunk[0]/Serial[0]/Dense[1]/"
                    "kernel");
    expect_reformer("ReformerLM.pos_type = 'fixed-base'\nReformerLM.mode = 'eval'\nReformerLM.ff_use_sru = 0\n"
                    "ReformerLM.pos_start_from_zero_prob = 1\nReformerLM.loss_sparsity_prob = None\n"
                    "ReformerLM.pos_axial_shape = ()\nReformerLM.pos_type = None\n",
                    NULL);
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = 'LSHSelfAttention'\n",
                            "r.gin:7:1: ReformerLM.attention_type = 'LSHSelfAttention' is not an attention type",
                            "write @LSHSelfAttention", "@CausalAttention", "@SelfAttention");
    EXPECT_REFORMER_REFUSED("ReformerLM.ff_activation = 'Swish'\n", "r.gin:7:1: ReformerLM.ff_activation = 'Swish'");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'infinite'\n", "r.gin:7:1: ReformerLM.pos_type = 'infinite'");
    EXPECT_REFORMER_REFUSED("ReformerLM.ff_sparsity = 64\n", "r.gin:7:1: ReformerLM.ff_sparsity = 64");
    EXPECT_REFORMER_REFUSED("ReformerLM.loss_sparsity = 4\n", "r.gin:7:1: ReformerLM.loss_sparsity = 4");
    EXPECT_REFORMER_REFUSED("ReformerLM.loss_sparsity_prob = 0.5\n", "r.gin:7:1: ReformerLM.loss_sparsity_prob");
    EXPECT_REFORMER_REFUSED("ReformerLM.loss_d_lowrank = 8\n", "r.gin:7:1: ReformerLM.loss_d_lowrank");
    EXPECT_REFORMER_REFUSED("ReformerLM.loss_sparsity_type = 'lowrank'\n", "r.gin:7:1: ReformerLM.loss_sparsity_type");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_chunk_size = 8\n", "r.gin:7:1: ReformerLM.attention_chunk_size");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_start_from_zero_prob = 0.5\n",
                            "r.gin:7:1: ReformerLM.pos_start_from_zero_prob");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_max_offset_to_add = 3\n", "r.gin:7:1: ReformerLM.pos_max_offset_to_add");
    EXPECT_REFORMER_REFUSED("ReformerLM.mode = 'predict'\n", "r.gin:7:1: ReformerLM.mode = 'predict' is not supported");
    // CausalAttention (ctrax's) has d_model / n_heads per head: another depth is refused.
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @CausalAttention\nReformerLM.d_attention_key = 64\n",
                            "ReformerLM.d_attention_key/d_attention_value = 64/0: CausalAttention's heads");
    // Axial positions from tuples (Trax's pos_axial_shape / pos_d_axial_embs) or Trax's older
    // spellings; the tuples without pos_type 'axial' are refused (Trax would ignore them).
    expect_reformer("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (2, 3)\n"
                    "ReformerLM.pos_d_axial_embs = [3, 5]\n",
                    "ReformerLM/AxialPositionalEncoding[3]/axis_1");
    expect_reformer("ReformerLM.axial_pos_shape = (3, 2)\nReformerLM.d_axial_pos_embs = (4, 4)\n",
                    "ReformerLM/AxialPositionalEncoding[3]/axis_0");
    expect_reformer("ReformerLM.axial_pos_shape = 'fixed-base'\n", "ReformerLM/FixedBasePositionalEncoding[3]/start_vec");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_axial_shape = (2, 3)\nReformerLM.pos_d_axial_embs = (3, 5)\n",
                            "r.gin:7:1: ReformerLM.pos_axial_shape = (2, 3) is set but ReformerLM.pos_type is None, "
                            "not 'axial'");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'fixed-base'\nReformerLM.pos_d_axial_embs = (3, 5)\n",
                            "r.gin:8:1: ReformerLM.pos_d_axial_embs = (3, 5) is set but r.gin:7:1: "
                            "ReformerLM.pos_type is 'fixed-base', not 'axial'");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\n",
                            "r.gin:7:1: ReformerLM.pos_axial_shape: pos_type 'axial' needs 1 to 8 axes, got 0");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (2, 3)\n"
                            "ReformerLM.pos_d_axial_embs = (3, 4)\n",
                            "r.gin:9:1: ReformerLM.pos_d_axial_embs sum to 7, not d_model 8");
    // A product or sum past a C int is refused, not wrapped (the product once
    // wrapped to 0 and the model was built, to fail at its first batch).
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (65536, 65536, 65536, 65536)\n"
                            "ReformerLM.pos_d_axial_embs = (2, 2, 2, 2)\n",
                            "r.gin:8:1: ReformerLM.pos_axial_shape multiplies to more than 2147483647 tokens");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (2, 3)\n"
                            "ReformerLM.pos_d_axial_embs = (1073741824, 1073741824)\n",
                            "r.gin:9:1: ReformerLM.pos_d_axial_embs sum to 2147483648, not d_model 8");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (2, 3)\n"
                            "ReformerLM.pos_d_axial_embs = (8,)\n",
                            "r.gin:8:1: ReformerLM.pos_axial_shape = (2, 3) and r.gin:9:1: ReformerLM.pos_d_axial_embs "
                            "= (8,): one width per axis (2 axes, 1 widths)");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (2, 'a')\n"
                            "ReformerLM.pos_d_axial_embs = (4, 4)\n",
                            "r.gin:8:1: ReformerLM.pos_axial_shape = (2, 'a'): expected a tuple of 1 to 8 ints");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (1, 1, 1, 1, 1, 1, 1, 1, 2)\n"
                            "ReformerLM.pos_d_axial_embs = (1, 1, 1, 1, 1, 1, 1, 1, 0)\n",
                            "r.gin:8:1: ReformerLM.pos_axial_shape = (1, 1, 1, 1, 1, 1, 1, 1, 2): expected a tuple of 1 "
                            "to 8 ints");
    EXPECT_REFORMER_REFUSED("ReformerLM.axial_pos_shape = (2, 3)\nReformerLM.pos_axial_shape = (2, 3)\n",
                            "r.gin:8:1: ReformerLM.pos_axial_shape and r.gin:7:1: ReformerLM.axial_pos_shape are two "
                            "spellings of one parameter");
    EXPECT_REFORMER_REFUSED("ReformerLM.d_axial_pos_embs = (4, 4)\nReformerLM.pos_d_axial_embs = (4, 4)\n",
                            "r.gin:8:1: ReformerLM.pos_d_axial_embs and r.gin:7:1: ReformerLM.d_axial_pos_embs");
    EXPECT_REFORMER_REFUSED("ReformerLM.axial_pos_shape = 'sin-cos'\n",
                            "r.gin:7:1: ReformerLM.axial_pos_shape = 'sin-cos' is not supported: the string "
                            "'fixed-base'");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'no'\nReformerLM.axial_pos_shape = 'fixed-base'\n",
                            "r.gin:8:1: ReformerLM.axial_pos_shape = 'fixed-base' means pos_type 'fixed-base', but "
                            "r.gin:7:1: ReformerLM.pos_type = 'no'");
    // The axial shape must multiply to the inputs' length (copy task, train_length 5: 10 tokens),
    // known where the run is planned: both settings named, with their places.
    {
        ct_config_run_shape run = {.model = "ReformerLM", .inputs = "sequence_copy_inputs", .batch_size = 2};
        static const char axial[] = "ReformerLM.vocab_size = 8\nReformerLM.d_model = 8\nReformerLM.n_heads = 2\n"
                                    "ReformerLM.pos_type = 'axial'\nReformerLM.pos_d_axial_embs = (4, 4)\n"
                                    COPY_INPUTS(5);
        char text[1024];
        snprintf(text, sizeof text, "%sReformerLM.pos_axial_shape = (2, 4)\n", axial);
        expect_budget(text, run, CT_ERR_ARG,
                      (const char *const[]){"big.gin:11:1: ReformerLM.pos_axial_shape = (2, 4) multiplies to 8, but the "
                                            "inputs' examples are 10 tokens long (big.gin:7:1: "
                                            "sequence_copy_inputs.train_length = 5)",
                                            NULL});
        snprintf(text, sizeof text, "%sReformerLM.pos_axial_shape = (2, 5)\n", axial);
        expect_budget(text, run, CT_OK, (const char *const[]){NULL});
        // Trax's older spelling is named as the config wrote it.
        snprintf(text, sizeof text, "%sReformerLM.axial_pos_shape = (2, 4)\n", axial);
        expect_budget(text, run, CT_ERR_ARG,
                      (const char *const[]){"big.gin:11:1: ReformerLM.axial_pos_shape = (2, 4) multiplies to 8", NULL});
    }
    // ff_use_sru is stored: k SRU(d_model) layers (each a Dense(3 d_model)) replace each feed-forward
    // (its LayerNorm, Dense(d_ff), Dense(d_model)); the plan's weights say so without building.
    {
        double w[2];
        for (int k = 0; k < 2; k++) {
            ct_error err = {0};
            char text[1024];
            snprintf(text, sizeof text, "%sReformerLM.ff_use_sru = %d\n", REFORMER_SMALL, 2 * k);
            ct_config *cfg = parse_cfg("r.gin", text, &err);
            ct_config_memory mem;
            CHECK_OK(ct_config_check_memory(cfg, &(ct_config_run_shape){.model = "ReformerLM", .batch_size = 1}, &mem,
                                            &err),
                     &err);
            w[k] = mem.weights;
            ct_config_free(cfg);
        }
        double d = 8, ff = 12, ff_w = 2 * d + (d * ff + ff) + (ff * d + d), sru_w = 2 * (d * 3 * d + 3 * d);
        CHECK_MSG(w[1] - w[0] == sru_w - ff_w, "ff_use_sru 2 plans %.0f weights, 0 plans %.0f", w[1], w[0]);
    }
    // The old per-model names of SelfAttention's settings are gone: Trax binds them on the type.
    {
        ct_config *cfg = ct_config_new();
        ct_error err = {0};
        const char *t = "ReformerLM.self_attention_chunk_len = 2\n";
        CHECK(ct_config_parse_text(cfg, t, strlen(t), "r.gin", &err) == CT_ERR_ARG);
        CHECK_MSG(strstr(err.msg, "r.gin:1:1:") && strstr(err.msg, "self_attention_chunk_len"), "%s", err.msg);
        ct_config_free(cfg);
    }
}

// ---- ReformerLM.attention_type and the attention types' bindings ----------------------------

// Every layer of type `type` under l, in tree order (the model's layers in order).
static int find_layers(ct_layer *l, const char *type, ct_layer **out, int max, int n) {
    if (!strcmp(ct_layer_type(l), type) && n < max) out[n++] = l;
    for (int i = 0; i < l->n_sub; i++) n = find_layers(l->sub[i], type, out, max, n);
    return n;
}

// The model of REFORMER_SMALL + extra, built (NULL on failure, err set), with
// what it wrote to stderr (its warnings) in *log (ct_free it).
static ct_layer *reformer_with_log(const char *extra, ct_config **cfg_out, char **log, ct_error *err) {
    char text[2048];
    snprintf(text, sizeof text, "%s%s", REFORMER_SMALL, extra);
    ct_config *cfg = parse_cfg("r.gin", text, err);
    fflush(stderr);
    char path[] = "/tmp/ctrax_test_config_log_XXXXXX";
    int fd = mkstemp(path), saved = dup(2);
    CHECK(fd >= 0 && saved >= 0);
    dup2(fd, 2);
    ct_layer *m = build_model(cfg, "ReformerLM", err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    close(fd);
    size_t len;
    *log = read_all(path, &len);
    unlink(path);
    CHECK(*log != NULL);
    if (cfg_out) *cfg_out = cfg;
    else ct_config_free(cfg);
    return m;
}

// Whether the binding name.param of cfg was read.
static bool binding_used(const ct_config *cfg, const char *name, const char *param) {
    for (int i = 0; i < ct_config_n_bindings(cfg); i++) {
        ct_config_binding_info b = ct_config_binding_at(cfg, i);
        if (!strcmp(b.name, name) && !strcmp(b.param, param)) return b.used;
    }
    CHECK_MSG(false, "%s.%s is not bound", name, param);
    return false;
}

static void test_reformer_attention_types(void) {
    ct_error err = {0};
    char *log;
    ct_config *cfg;
    // A list of two types cycles over 4 layers: layer i has type i % 2; each
    // type gets its own bindings; ReformerLM's arguments win over theirs.
    ct_layer *m = reformer_with_log("ReformerLM.n_layers = 4\n"
                                    "ReformerLM.attention_type = [@SelfAttention, @trax.layers.LSHSelfAttention]\n"
                                    "SelfAttention.chunk_len = 3\nSelfAttention.n_chunks_before = 1\n"
                                    "SelfAttention.bias = True\nSelfAttention.n_parallel_heads = 2\n"
                                    "LSHSelfAttention.chunk_len = 4\nLSHSelfAttention.n_hashes = 3\n"
                                    "LSHSelfAttention.n_buckets = (2, 4)\nLSHSelfAttention.n_chunks_after = 1\n"
                                    "LSHSelfAttention.max_length_for_buckets = 24\n"
                                    "LSHSelfAttention.attention_dropout = 0.0\nLSHSelfAttention.n_heads = 4\n"
                                    "LSHSelfAttention.n_parallel_heads = 1\nLSHSelfAttention.share_qk = True\n"
                                    "LSHSelfAttention.use_python_loop = True\nLSHSelfAttention.predict_mem_len = 9\n",
                                    &cfg, &log, &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) {
        ct_layer *attn[8];
        int n = 0;
        // The attention half-residuals in order; sub[0] is Serial(LayerNorm, attention).
        ct_layer *halves[8];
        int n_halves = find_layers(m, "ReversibleHalfResidual", halves, 8, 0);
        for (int i = 0; i < n_halves; i++)
            if (!strcmp(halves[i]->name, "ReversibleHalfResidualAttn")) {
                ct_layer *l = halves[i]->sub[0]->sub[1];
                attn[n++] = l;
            }
        CHECK_MSG(n == 4, "%d attention layers", n);
        for (int i = 0; i < n; i++)
            CHECK_MSG(!strcmp(ct_layer_type(attn[i]), i % 2 ? "LSHSelfAttention" : "SelfAttention"),
                      "layer %d is %s", i, ct_layer_type(attn[i]));
        // Both layer types keep their params struct first in hp.
        const ct_self_attention_params *s = attn[0]->hp;
        CHECK(s->chunk_len == 3 && s->n_chunks_before == 1 && s->n_chunks_after == 0 && s->bias && !s->share_qk);
        // d_attention_key / d_attention_value unbound: Trax's 64.
        CHECK(s->n_heads == 2 && s->d_qk == 64 && s->d_v == 64 && s->causal && !s->masked);
        CHECK(s->attention_dropout == 0.1f && s->output_dropout == 0.1f);
        const ct_lsh_self_attention_params *l = attn[1]->hp;
        CHECK(l->chunk_len == 4 && l->n_hashes == 3 && l->n_buckets[0] == 2 && l->n_buckets[1] == 4);
        CHECK(l->n_chunks_before == 1 && l->n_chunks_after == 1 && l->max_length_for_buckets == 24);
        CHECK(l->n_heads == 2 && l->attention_dropout == 0.1f && l->causal);
        ct_layer_free(m);
    }
    CHECK_MSG(strstr(log, "r.gin:18:1: LSHSelfAttention.attention_dropout = 0.0 is overridden by ReformerLM, which "
                          "passes dropout = 0.1, as in Trax"),
              "%s", log);
    CHECK_MSG(strstr(log, "r.gin:19:1: LSHSelfAttention.n_heads = 4 is overridden by ReformerLM, which passes "
                          "n_heads = 2"),
              "%s", log);
    // Read (no "bound but never read"), though they change nothing.
    CHECK(binding_used(cfg, "LSHSelfAttention", "n_parallel_heads") && binding_used(cfg, "LSHSelfAttention", "share_qk"));
    CHECK(binding_used(cfg, "LSHSelfAttention", "use_python_loop") && binding_used(cfg, "SelfAttention", "bias"));
    CHECK(binding_used(cfg, "LSHSelfAttention", "predict_mem_len"));
    ct_free(log);
    ct_config_free(cfg);

    // The default is Trax's SelfAttention: LSHSelfAttention.* is then never
    // read, so `ctrax train` warns that it is bound but unread.
    m = reformer_with_log("SelfAttention.chunk_len = 2\nLSHSelfAttention.n_hashes = 2\n", &cfg, &log, &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    if (m) {
        ct_layer *a[4];
        CHECK(find_layers(m, "SelfAttention", a, 4, 0) == 1 && find_layers(m, "DotProductCausalAttention", a, 4, 0) == 0);
        ct_layer_free(m);
    }
    CHECK(binding_used(cfg, "SelfAttention", "chunk_len") && !binding_used(cfg, "LSHSelfAttention", "n_hashes"));
    ct_free(log);
    ct_config_free(cfg);
    // max_length_for_buckets unbound is Trax's None (0 in the struct): the
    // operative config writes None, which reads back (0 is out of its range).
    {
        char t[1024];
        snprintf(t, sizeof t, "%sReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.chunk_len = 2\n",
                 REFORMER_SMALL);
        cfg = parse_cfg("r.gin", t, &err);
        m = build_model(cfg, "ReformerLM", &err);
        CHECK_MSG(m != NULL, "%s", err.msg);
        if (m) ct_layer_free(m);
        char *op = ct_config_operative_text(cfg);
        CHECK_MSG(strstr(op, "\nLSHSelfAttention.max_length_for_buckets = None\n"), "%s", op);
        ct_config *back = ct_config_new();
        CHECK_OK(ct_config_parse_text(back, op, strlen(op), "operative.gin", &err), &err);
        CHECK_OK(ct_config_validate(back, &err), &err);
        ct_config_free(back);
        ct_free(op);
        ct_config_free(cfg);
    }
    // One type, module-qualified (Trax's reformer_copy.gin form); a scope.
    expect_reformer("ReformerLM.attention_type = @trax.layers.LSHSelfAttention\nLSHSelfAttention.chunk_len = 2\n",
                    "ReformerLM/ReversibleSerial[5]/ReversibleHalfResidualAttn[0]/Serial[0]/LSHSelfAttention[1]/Wq[1]");
    expect_reformer("ReformerLM.attention_type = @CausalAttention\n", NULL);
    expect_reformer("ReformerLM.attention_type = (@s/LSHSelfAttention,)\ns/LSHSelfAttention.chunk_len = 3\n",
                    "ReformerLM/ReversibleSerial[5]/ReversibleHalfResidualAttn[0]/Serial[0]/LSHSelfAttention[1]/Wq[1]");

    // Refusals name the parameter, its place and the value.
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = 'SelfAttention'\n",
                            "r.gin:7:1: ReformerLM.attention_type = 'SelfAttention' is not an attention type",
                            "write @SelfAttention");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @Adam\n",
                            "r.gin:7:1: ReformerLM.attention_type = @Adam is not an attention type",
                            "@CausalAttention (the default), @SelfAttention, @LSHSelfAttention or a list of them");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = [@SelfAttention, 3]\n",
                            "r.gin:7:1: ReformerLM.attention_type = [@SelfAttention, 3] is not an attention type");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = []\n", "r.gin:7:1: ReformerLM.attention_type = []",
                            "1 to 16");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = [@SelfAttention, @LSHSelfAttention]\n",
                            "r.gin:7:1: ReformerLM.attention_type", "cycle evenly over n_layers 1");
    EXPECT_REFORMER_REFUSED("ReformerLM.n_layers = 2\nReformerLM.attention_type = [@a/SelfAttention, "
                            "@b/SelfAttention]\n",
                            "r.gin:8:1: ReformerLM.attention_type", "@a/SelfAttention and @b/SelfAttention");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.mode = 'predict'\n",
                            "r.gin:8:1: LSHSelfAttention.mode = 'predict' is not supported", "no 'predict' mode");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @SelfAttention\nSelfAttention.mode = 'predict'\n",
                            "r.gin:8:1: SelfAttention.mode = 'predict' is not supported");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.bias = True\n",
                            "r.gin:8:1: LSHSelfAttention.bias = True is not supported", "crashes in Trax");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.chunk_len = None\n",
                            "r.gin:8:1: LSHSelfAttention.chunk_len = None is not supported");
    EXPECT_REFORMER_REFUSED("ReformerLM.pos_type = 'axial'\nReformerLM.pos_axial_shape = (0, 16)\n"
                            "ReformerLM.pos_d_axial_embs = (4, 4)\n",
                            "r.gin:8:1: ReformerLM.pos_axial_shape = (0, 16): expected a tuple of 1 to");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = [@SelfAttention, @SelfAttention, @SelfAttention, "
                            "@SelfAttention, @SelfAttention, @SelfAttention, @SelfAttention, @SelfAttention, "
                            "@SelfAttention, @SelfAttention, @SelfAttention, @SelfAttention, @SelfAttention, "
                            "@SelfAttention, @SelfAttention, @SelfAttention, @SelfAttention]\n",
                            "a list of 1 to 16 attention types, got 17");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.n_buckets = 5\n",
                            "r.gin:8:1: LSHSelfAttention.n_buckets = 5: expected None, an even int");
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @LSHSelfAttention\n"
                            "LSHSelfAttention.n_buckets = [2, 2, 2, 2, 2]\n",
                            "r.gin:8:1: LSHSelfAttention.n_buckets = [2, 2, 2, 2, 2]", "up to 4 even factors");
    // Trax's list of factors, three of them.
    expect_reformer("ReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.chunk_len = 2\n"
                    "LSHSelfAttention.n_buckets = [2, 4, 8]\n",
                    "ReformerLM/ReversibleSerial[5]/ReversibleHalfResidualAttn[0]/Serial[0]/LSHSelfAttention[1]/Wq[0]");
    {
        // ctrax train --configurables says what the check above takes (it said "2 even factors").
        char *reg = ct_config_registry_text();
        const char *line = strstr(reg, "LSHSelfAttention.n_buckets = None  #");
        CHECK_MSG(line && strstr(line, "list/tuple of up to 4 even factors") &&
                      strstr(line, "list/tuple of up to 4 even factors") < strchr(line, '\n'),
                  "%.200s", line ? line : "no LSHSelfAttention.n_buckets line");
        ct_free(reg);
    }
    EXPECT_REFORMER_REFUSED("ReformerLM.attention_type = @LSHSelfAttention\nLSHSelfAttention.n_buckets = 'x'\n",
                            "r.gin:8:1: LSHSelfAttention.n_buckets = 'x'");
    {
        // Types and ranges are checked when bound.
        ct_config *c = ct_config_new();
        const char *t = "LSHSelfAttention.n_parallel_heads = 0\n";
        CHECK(ct_config_parse_text(c, t, strlen(t), "r.gin", &err) == CT_ERR_ARG);
        CHECK_MSG(strstr(err.msg, "r.gin:1:1: LSHSelfAttention.n_parallel_heads must be >= 1"), "%s", err.msg);
        ct_config_free(c);
    }
}

// ---- Trax's defaults the train settings take from elsewhere -----------------------------------

static ct_status read_train_text(const char *text, ct_config **cfg, ct_train_settings *t, ct_error *err) {
    *cfg = parse_cfg("t.gin", text, err);
    return ct_config_read_train(*cfg, t, err);
}

static void test_train_defaults_from_trax(void) {
    ct_error err = {0};
    ct_config *cfg;
    ct_train_settings t;
    // No lr_schedule_fn: Trax's multifactor, whose bindings then apply.
    CHECK_OK(read_train_text("multifactor.constant = 0.05\nmultifactor.warmup_steps = 40\n", &cfg, &t, &err), &err);
    CHECK(t.lr_schedule_fn && !strcmp(t.lr_schedule_fn, "multifactor"));
    ct_schedule *s = t.lr_schedule_fn ? build_schedule(cfg, t.lr_schedule_fn, &err) : NULL, *d = NULL;
    ct_multifactor_params mp = ct_multifactor_default_params();
    CHECK(!strcmp(mp.factors, "constant * linear_warmup * rsqrt_decay") && mp.constant == 0.1 && mp.warmup_steps == 400);
    mp.constant = 0.05, mp.warmup_steps = 40;
    CHECK_OK(ct_schedule_multifactor(&mp, &d, &err), &err);
    if (s && d) same_schedule(s, d, "default lr_schedule_fn with multifactor bindings");
    CHECK(s && ct_schedule_value(s, 10) == (float)(0.05 * 10 / 40.0 / sqrt(40.0)));
    ct_schedule_free(s);
    ct_schedule_free(d);
    for (int i = 0; i < ct_config_n_bindings(cfg); i++) CHECK(ct_config_binding_at(cfg, i).used);
    ct_config_free(cfg);
    // None: no schedule, the optimizer's learning_rate every step (ctrax's).
    CHECK_OK(read_train_text("train.lr_schedule_fn = None\n", &cfg, &t, &err), &err);
    CHECK(t.lr_schedule_fn == NULL);
    ct_config_free(cfg);
    CHECK_OK(read_train_text("train.lr_schedule_fn = @constant\nconstant.value = 0.25\n", &cfg, &t, &err), &err);
    CHECK(t.lr_schedule_fn && !strcmp(t.lr_schedule_fn, "constant"));
    ct_config_free(cfg);

    // The inputs' batch_size (Trax's) is the run's; train.batch_size bound to
    // another value is an error naming both bindings.
    static const char copy[] = "train.inputs = @sequence_copy_inputs\nsequence_copy_inputs.vocab_size = 8\n"
                               "sequence_copy_inputs.train_length = 5\nsequence_copy_inputs.eval_min_length = 4\n"
                               "sequence_copy_inputs.eval_max_length = 5\n";
    char text[1024];
    snprintf(text, sizeof text, "%ssequence_copy_inputs.batch_size = 12\n", copy);
    CHECK_OK(read_train_text(text, &cfg, &t, &err), &err);
    CHECK(t.batch_size == 12);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, t.inputs, t.batch_size, 1, &train, &eval, &err), &err);
    ct_batch b;
    CHECK_OK(ct_stream_next(train, &b, &err), &err);
    CHECK(b.t[0].shape[0] == 12);
    ct_stream_free(train);
    ct_stream_free(eval);
    CHECK(ct_config_build_inputs(cfg, t.inputs, 32, 1, &train, &eval, &err) == CT_ERR_ARG && !train && !eval);
    CHECK_MSG(strstr(err.msg, "t.gin:6:1: sequence_copy_inputs.batch_size = 12, but batches of 32 were asked for"),
              "%s", err.msg);
    // The operative config says 12 for both and reads back.
    char *op = ct_config_operative_text(cfg);
    CHECK(strstr(op, "\ntrain.batch_size = 12\n") && strstr(op, "\nsequence_copy_inputs.batch_size = 12\n"));
    ct_config_free(cfg);
    CHECK_OK(read_train_text(op, &cfg, &t, &err), &err);
    CHECK(t.batch_size == 12);
    ct_config_free(cfg);
    ct_free(op);
    snprintf(text, sizeof text, "%saddition_inputs.batch_size = 12\ntrain.batch_size = 12\n",
             "train.inputs = @addition_inputs\n");
    CHECK_OK(read_train_text(text, &cfg, &t, &err), &err);
    CHECK(t.batch_size == 12);
    ct_config_free(cfg);
    snprintf(text, sizeof text, "%ssequence_copy_inputs.batch_size = 12\ntrain.batch_size = 64\n", copy);
    CHECK(read_train_text(text, &cfg, &t, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "t.gin:6:1: sequence_copy_inputs.batch_size = 12 and t.gin:7:1: train.batch_size = 64 "
                              "set the batch size differently"),
              "%s", err.msg);
    ct_config_free(cfg);
    // Unbound: train.batch_size as before.
    snprintf(text, sizeof text, "%strain.batch_size = 7\n", copy);
    CHECK_OK(read_train_text(text, &cfg, &t, &err), &err);
    CHECK(t.batch_size == 7);
    ct_config_free(cfg);
    // Under mpirun (train.n_processes, which ctrax train binds) the inputs'
    // batch size is per process, as Trax's is per host: 3 processes of 12
    // make a step of 36, which the operative config records and reads back.
    snprintf(text, sizeof text, "%ssequence_copy_inputs.batch_size = 12\ntrain.n_processes = 3\n", copy);
    CHECK_OK(read_train_text(text, &cfg, &t, &err), &err);
    CHECK_MSG(t.batch_size == 36, "%lld", (long long)t.batch_size);
    CHECK_OK(ct_config_build_inputs(cfg, t.inputs, t.batch_size, 1, &train, &eval, &err), &err);
    if (train && ct_stream_next(train, &b, &err) == CT_OK) CHECK(b.t[0].shape[0] == 36);
    ct_stream_free(train);
    ct_stream_free(eval);
    CHECK(ct_config_build_inputs(cfg, t.inputs, 12, 1, &train, &eval, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "sequence_copy_inputs.batch_size = 12 (x 3 processes), but batches of 12 were asked for"),
              "%s", err.msg);
    op = ct_config_operative_text(cfg);
    CHECK(strstr(op, "\ntrain.batch_size = 36\n") && strstr(op, "\ntrain.n_processes = 3\n"));
    ct_config_free(cfg);
    CHECK_OK(read_train_text(op, &cfg, &t, &err), &err);
    CHECK(t.batch_size == 36);
    ct_config_free(cfg);
    ct_free(op);
    snprintf(text, sizeof text, "%ssequence_copy_inputs.batch_size = 12\ntrain.n_processes = 3\ntrain.batch_size = 12\n",
             copy);
    CHECK(read_train_text(text, &cfg, &t, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "t.gin:6:1: sequence_copy_inputs.batch_size = 12 (x 3 processes: 36) and t.gin:8:1: "
                              "train.batch_size = 12 set the batch size differently"),
              "%s", err.msg);
    ct_config_free(cfg);
}


// ---- Trax's defaults and data names (issue 14) -----------------------------------------------

// The MLP a config builds, initialized for (2, 28, 28) images: its weight
// count and output width (0 on failure).
static size_t mlp_weights(const char *text, int64_t *width) {
    ct_error err = {0};
    ct_config *cfg = parse_cfg("m.gin", text, &err);
    ct_layer *model = build_model(cfg, "MLP", &err);
    CHECK_MSG(model != NULL, "%s", err.msg);
    size_t n = 0;
    *width = 0;
    if (model) {
        ct_tensor in = ct_tensor_3d(CT_DTYPE_F32, 2, 28, 28, NULL);
        ct_device dev = ct_device_cpu();
        ct_net net;
        CHECK_OK(ct_net_init(&net, model, &in, 1, ct_key_from_seed(0), &dev, &err), &err);
        n = net.n_weights;
        *width = net.out_sigs[0].shape[1];
        ct_net_free(&net);
        ct_layer_free(model);
    }
    ct_config_free(cfg);
    return n;
}

static void test_trax_defaults_issue14(void) {
    ct_error err = {0};
    ct_config *cfg;
    ct_train_settings t;
    ct_loop_settings l;
    // The checkpoint period is train.eval_frequency unless Loop's is bound
    // (Trax's train makes n_steps_per_checkpoint its eval_frequency).
    cfg = parse_cfg("t.gin", "train.eval_frequency = 7\n", &err);
    CHECK_OK(ct_config_read_loop(cfg, &l, &err), &err);
    CHECK(l.n_steps_per_checkpoint == 7);
    char *op = ct_config_operative_text(cfg);
    CHECK_MSG(strstr(op, "\nLoop.n_steps_per_checkpoint = 7\n"), "%s", op);
    ct_free(op);
    ct_config_free(cfg);
    cfg = parse_cfg("t.gin", "train.eval_frequency = 7\nLoop.n_steps_per_checkpoint = 3\n", &err);
    CHECK_OK(ct_config_read_loop(cfg, &l, &err), &err);
    CHECK(l.n_steps_per_checkpoint == 3);
    ct_config_free(cfg);
    cfg = parse_cfg("t.gin", "train.eval_frequency = 0\n", &err);
    CHECK_OK(ct_config_read_loop(cfg, &l, &err), &err);
    CHECK(l.n_steps_per_checkpoint == 100);
    ct_config_free(cfg);

    // Unbound optimizer: Trax's Adafactor (its epsilon1: tests/test_optim.c).
    CHECK_OK(read_train_text("train.steps = 2\n", &cfg, &t, &err), &err);
    CHECK(!strcmp(t.optimizer, "Adafactor"));
    ct_config_free(cfg);

    // Trax's older train.lr_schedule = @lr_schedules.constant() (mlp_mnist.gin).
    CHECK_OK(read_train_text("train.lr_schedule = @lr_schedules.constant()\nlr_schedules.constant.value = 0.0001\n",
                             &cfg, &t, &err),
             &err);
    CHECK_MSG(t.lr_schedule_fn && !strcmp(t.lr_schedule_fn, "constant"), "%s",
              t.lr_schedule_fn ? t.lr_schedule_fn : "NULL");
    ct_config_free(cfg);
    CHECK(read_train_text("train.lr_schedule = @constant()\ntrain.lr_schedule_fn = @multifactor\nconstant.value = 1\n",
                          &cfg, &t, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "t.gin:1:1: train.lr_schedule = @constant()") &&
                  strstr(err.msg, "t.gin:2:1: train.lr_schedule_fn are two spellings"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);

    // Trax's older MLP parameters: [d_hidden] x n_hidden_layers + [n_output_classes].
    int64_t w1, w2, w3;
    size_t a = mlp_weights("MLP.d_hidden = 16\nMLP.n_hidden_layers = 2\nMLP.n_output_classes = 10\n", &w1);
    size_t b = mlp_weights("MLP.layer_widths = [16, 16, 10]\n", &w2);
    size_t c = mlp_weights("MLP.n_output_classes = 3\n", &w3);  // d_hidden 512, 2 hidden layers
    CHECK(a == (size_t)(784 * 16 + 16 + 16 * 16 + 16 + 16 * 10 + 10) && a == b && w1 == 10 && w2 == 10);
    CHECK(c == (size_t)(784 * 512 + 512 + 512 * 512 + 512 + 512 * 3 + 3) && w3 == 3);
    printf("  MLP from Trax's older d_hidden / n_hidden_layers / n_output_classes: %zu weights (= layer_widths "
           "[16, 16, 10]: %zu)\n",
           a, b);
    cfg = parse_cfg("m.gin", "MLP.layer_widths = [4]\nMLP.d_hidden = 8\n", &err);
    CHECK(build_model(cfg, "MLP", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "m.gin:1:1: MLP.layer_widths and m.gin:2:1: MLP's older"), "%s", err.msg);
    ct_config_free(cfg);
}


// Trax's shipped configs (trax/supervised/configs) for the models ctrax has:
// the parameters they bind that ctrax honours, accepts with no effect, or
// refuses saying why, and Trax's names ctrax does not implement.
static void test_trax_shipped_configs(void) {
    ct_error err = {0};
    ct_config *cfg;
    ct_train_settings t;
    ct_loop_settings l;
    // Loop.history_max: ct_loop_options.history_max (4096 unbound, -1 all);
    // 0, the Loop's "default", is refused rather than read as "none".
    const char *hist[] = {"", "Loop.history_max = 7\n", "Loop.history_max = -1\n"};
    const int64_t want_hist[] = {4096, 7, -1};
    for (int i = 0; i < 3; i++) {
        cfg = parse_cfg("t.gin", hist[i], &err);
        CHECK_OK(ct_config_read_loop(cfg, &l, &err), &err);
        CHECK_MSG(l.history_max == want_hist[i], "'%s': history_max %lld", hist[i], (long long)l.history_max);
        ct_config_free(cfg);
    }
    cfg = parse_cfg("t.gin", "Loop.history_max = 0\n", &err);
    CHECK(ct_config_read_loop(cfg, &l, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "t.gin:1:1: Loop.history_max = 0 would keep no metric history"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    cfg = ct_config_new();
    CHECK(ct_config_parse_text(cfg, "Loop.history_max = -2\n", 22, "t.gin", &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "t.gin:1:1: Loop.history_max"), "%s", err.msg);
    ct_config_free(cfg);

    // train.save_graphs (no effect) is read, so never reported unread.
    CHECK_OK(read_train_text("train.save_graphs = False\n", &cfg, &t, &err), &err);
    CHECK(binding_used(cfg, "train", "save_graphs"));
    ct_config_free(cfg);

    // TransformerLM.mode = 'train' (Trax's configs) builds; 'predict' is refused.
    const char *lm = "TransformerLM.vocab_size = 7\nTransformerLM.d_model = 8\nTransformerLM.d_ff = 8\n"
                     "TransformerLM.n_layers = 1\nTransformerLM.n_heads = 2\nTransformerLM.max_len = 16\n";
    char text[1024];
    snprintf(text, sizeof text, "%sTransformerLM.mode = 'train'\n", lm);
    cfg = parse_cfg("m.gin", text, &err);
    ct_layer *m = build_model(cfg, "TransformerLM", &err);
    CHECK_MSG(m != NULL, "%s", err.msg);
    ct_layer_free(m);
    ct_config_free(cfg);
    snprintf(text, sizeof text, "%sTransformerLM.mode = 'predict'\n", lm);
    cfg = parse_cfg("m.gin", text, &err);
    CHECK(build_model(cfg, "TransformerLM", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "m.gin:7:1: TransformerLM.mode = 'predict' is not supported by ctrax, only 'train' or "
                              "'eval'"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);

    // addition_inputs.encdec (reformer_addition.gin: Reformer2's inputs):
    // False builds, True is refused.
    const char *add = "addition_inputs.vocab_size = 13\naddition_inputs.train_length = 5\n"
                      "addition_inputs.eval_min_length = 6\naddition_inputs.eval_max_length = 8\n";
    for (int encdec = 0; encdec < 2; encdec++) {
        snprintf(text, sizeof text, "%saddition_inputs.encdec = %s\n", add, encdec ? "True" : "False");
        cfg = parse_cfg("a.gin", text, &err);
        ct_stream *train = NULL, *eval = NULL;
        ct_status st = ct_config_build_inputs(cfg, "addition_inputs", 4, 1, &train, &eval, &err);
        CHECK_MSG(encdec ? st == CT_ERR_ARG && strstr(err.msg, "a.gin:5:1: addition_inputs.encdec = True is not "
                                                               "supported by ctrax")
                         : st == CT_OK,
                  "encdec %d: %s", encdec, err.msg);
        if (encdec) printf("  error: %s\n", err.msg);
        ct_stream_free(train);
        ct_stream_free(eval);
        ct_config_free(cfg);
    }

    // Trax's names ctrax does not implement say so and what to use, instead
    // of the nearest ctrax name (SkippingTransformerLM is no TransformerLM).
    static const struct {
        const char *text, *want;
    } missing[] = {
        {"train.model = @trax.models.SkippingTransformerLM\n",
         "x.gin:1:15: 'trax.models.SkippingTransformerLM' is a Trax model ctrax does not implement: ctrax's models are "
         "TransformerLM, ReformerLM, RNNLM and MLP"},
        {"Reformer2.d_model = 256\n", "x.gin:1:1: 'Reformer2' is a Trax model ctrax does not implement"},
        {"train.model = @trax.models.NoSuchModel\n", "'trax.models.NoSuchModel' is a Trax model ctrax does not"},
        {"data_streams.preprocess_fn = @trax.data.tf_inputs.lm1b_preprocess\n",
         "x.gin:1:30: 'trax.data.tf_inputs.lm1b_preprocess' is Trax's TFDS data pipeline (trax.data), which ctrax does "
         "not implement (it reads no TFDS): replace the config's data lines"},
        {"lm1b_preprocess.max_target_length = 512\n", "x.gin:1:1: 'lm1b_preprocess' is Trax's TFDS data pipeline"},
        {"DotProductCausalAttention.dropout = 0.1\n",
         "x.gin:1:1: 'DotProductCausalAttention' is a Trax attention layer ctrax does not implement"},
        {"TransformerLMM.d_model = 8\n", "x.gin:1:1: unknown configurable 'TransformerLMM' (did you mean "
                                          "'TransformerLM'?)"},
    };
    for (size_t i = 0; i < sizeof missing / sizeof *missing; i++) {
        cfg = ct_config_new();
        CHECK(ct_config_parse_text(cfg, missing[i].text, strlen(missing[i].text), "x.gin", &err) == CT_ERR_ARG);
        CHECK_MSG(strstr(err.msg, missing[i].want), "'%s' not in: %s", missing[i].want, err.msg);
        if (i < 2) printf("  error: %s\n", err.msg);
        ct_config_free(cfg);
    }
}

// A scope reaches what the scoped configurable calls, as in gin: @eval/ReformerLM
// runs ReformerLM with scope 'eval' active, so the attention type it calls
// through an unscoped @LSHSelfAttention reads eval/LSHSelfAttention.* first; a
// scoped @s/SelfAttention runs in scope 's' alone (gin replaces the active
// scope with a reference's own). The eval model of `ctrax train` is
// eval/<model> when any eval/ binding exists, so eval/LSHSelfAttention.n_hashes
// was bound, never read, and the eval model hashed with the training value.
static void test_nested_scopes(void) {
    ct_error err = {0};
    char text[1024];
    snprintf(text, sizeof text,
             "%sReformerLM.n_layers = 2\nReformerLM.attention_type = [@LSHSelfAttention, @s/SelfAttention]\n"
             "LSHSelfAttention.chunk_len = 4\nLSHSelfAttention.n_hashes = 2\neval/LSHSelfAttention.n_hashes = 3\n"
             "s/SelfAttention.chunk_len = 3\neval/s/SelfAttention.chunk_len = 2\n",
             REFORMER_SMALL);
    ct_config *cfg = parse_cfg("r.gin", text, &err);
    const char *names[] = {"ReformerLM", "eval/ReformerLM"};
    const int want_hashes[] = {2, 3};
    for (int k = 0; k < 2; k++) {
        ct_layer *m = build_model(cfg, names[k], &err);
        CHECK_MSG(m != NULL, "%s: %s", names[k], err.msg);
        if (!m) continue;
        ct_layer *lsh[2], *self[2];
        int n_lsh = find_layers(m, "LSHSelfAttention", lsh, 2, 0), n_self = find_layers(m, "SelfAttention", self, 2, 0);
        CHECK_MSG(n_lsh == 1 && n_self == 1, "%s: %d LSHSelfAttention, %d SelfAttention", names[k], n_lsh, n_self);
        if (n_lsh == 1 && n_self == 1) {
            const ct_lsh_self_attention_params *l = lsh[0]->hp;
            const ct_self_attention_params *s = self[0]->hp;
            CHECK_MSG(l->n_hashes == want_hashes[k], "%s: n_hashes %d, want %d", names[k], l->n_hashes,
                      want_hashes[k]);
            CHECK_MSG(s->chunk_len == 3, "%s: SelfAttention.chunk_len %d, want 3 (s/, not eval/s/)", names[k],
                      s->chunk_len);
        }
        ct_layer_free(m);
    }
    CHECK(binding_used(cfg, "eval/LSHSelfAttention", "n_hashes") &&
          !binding_used(cfg, "eval/s/SelfAttention", "chunk_len"));
    char *op = ct_config_operative_text(cfg);
    CHECK_MSG(strstr(op, "\neval/LSHSelfAttention.n_hashes = 3\n"), "%s", op);
    ct_free(op);
    ct_config_free(cfg);

    // Batches of 1 to 2^24 examples.
    cfg = parse_cfg("b.gin", COPY_INPUTS(5), &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK(ct_config_build_inputs(cfg, "sequence_copy_inputs", (1 << 24) + 1, 1, &train, &eval, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "batch_size 16777217 is out of range (1 to 2^24)") && !train && !eval, "%s", err.msg);
    CHECK_OK(ct_config_build_inputs(cfg, "sequence_copy_inputs", 1 << 24, 1, &train, &eval, &err), &err);
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);

    // A scope reads the scope around it before the unscoped binding: a/b/ reads a/'s.
    cfg = parse_cfg("s.gin", "TransformerLM.d_model = 16\na/TransformerLM.d_model = 8\n", &err);
    int64_t d_model = 0;
    CHECK_OK(ct_config_get_int(cfg, "a/b/TransformerLM", "d_model", 0, &d_model, &err), &err);
    CHECK_MSG(d_model == 8, "a/b/TransformerLM.d_model %lld, want a/'s 8", (long long)d_model);
    ct_config_free(cfg);

    // Trax's batcher calls data_streams: under s/batcher, s/data_streams.*.
    make_tmp_dir();
    write_idx(tmp_file("train-images-idx3-ubyte"), tmp_file("train-labels-idx1-ubyte"), 10, 0);
    write_idx(tmp_file("t10k-images-idx3-ubyte"), tmp_file("t10k-labels-idx1-ubyte"), 6, 5);
    snprintf(text, sizeof text, "s/data_streams.data_dir = '%s'\ns/data_streams.dataset_name = 'mnist'\n", tmp_dir);
    cfg = parse_cfg("b.gin", text, &err);
    CHECK_OK(ct_config_build_inputs(cfg, "s/batcher", 4, 1, &train, &eval, &err), &err);
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    const char *files[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"};
    remove_tmp(files, 4);
}

// Checks at the edges of what the builders take.
static void test_builder_edges(void) {
    ct_error err = {0};
    // TransformerLM's table is fixed sinusoids or learned, not both.
    ct_config *cfg =
        parse_cfg("t.gin", "TransformerLM.learned_positions = True\nTransformerLM.fixed_positions = True\n", &err);
    ct_layer *m = build_model(cfg, "TransformerLM", &err);
    CHECK_MSG(!m && strstr(err.msg, "t.gin:2:1: TransformerLM.fixed_positions = True and learned_positions = True"),
              "%s", m ? "built" : err.msg);
    if (m) ct_layer_free(m);
    ct_config_free(cfg);
    // An MLP width is 1 to 2^24.
    cfg = parse_cfg("m.gin", "MLP.layer_widths = [4, 16777217]\n", &err);
    m = build_model(cfg, "MLP", &err);
    CHECK_MSG(!m && strstr(err.msg, "m.gin:1:24: MLP.layer_widths[1] must be an int in [1, 16777216], got 16777217"),
              "%s", m ? "built" : err.msg);
    if (m) ct_layer_free(m);
    ct_config_free(cfg);
    // Trax's addition_inputs: eval lengths eval_min_length..eval_max_length,
    // one length when they are equal.
    cfg = parse_cfg("a.gin",
                      "addition_inputs.vocab_size = 13\naddition_inputs.train_length = 5\n"
                      "addition_inputs.eval_min_length = 6\naddition_inputs.eval_max_length = 6\n",
                      &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, "addition_inputs", 2, 1, &train, &eval, &err), &err);
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    // The train and eval streams draw from seeds of their own: with the
    // same lengths, their first batches differ.
    cfg = parse_cfg("c.gin",
                      "sequence_copy_inputs.vocab_size = 8\nsequence_copy_inputs.train_length = 9\n"
                      "sequence_copy_inputs.train_min_length = 8\nsequence_copy_inputs.eval_min_length = 8\n"
                      "sequence_copy_inputs.eval_max_length = 9\nsequence_copy_inputs.pad_to_multiple = 1\n",
                      &err);
    CHECK_OK(ct_config_build_inputs(cfg, "sequence_copy_inputs", 4, 1, &train, &eval, &err), &err);
    if (train && eval) {
        ct_batch a, b;
        CHECK_OK(ct_stream_next(train, &a, &err), &err);
        CHECK_OK(ct_stream_next(eval, &b, &err), &err);
        CHECK(is_lm_batch(&a, 4, 18) && is_lm_batch(&b, 4, 18) && !batches_equal(&a, &b));
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
}

// Trax's batcher / data_streams over MNIST-format IDX files in data_dir.
static void test_batcher_inputs(void) {
    make_tmp_dir();
    write_idx(tmp_file("train-images-idx3-ubyte"), tmp_file("train-labels-idx1-ubyte"), 10, 0);
    write_idx(tmp_file("t10k-images-idx3-ubyte"), tmp_file("t10k-labels-idx1-ubyte"), 6, 5);
    ct_error err = {0};
    char text[4096];
    snprintf(text, sizeof text,
             "batcher.data_streams = @tf_inputs.data_streams\nbatcher.batch_size_per_device = 4\n"
             "batcher.eval_batch_size = 3\nbatcher.variable_shapes = False\n"
             "data_streams.data_dir = '%s'\ndata_streams.dataset_name = 'mnist'\n",
             tmp_dir);
    // train.inputs unbound with a dataset_name bound: Trax's default @batcher,
    // batch_size_per_device x n_devices examples a step.
    ct_config *cfg;
    ct_train_settings t;
    CHECK_OK(read_train_text(text, &cfg, &t, &err), &err);
    CHECK(t.inputs && !strcmp(t.inputs, "batcher") && t.batch_size == 4);
    ct_config_free(cfg);
    char t2[4300];
    snprintf(t2, sizeof t2, "%strain.n_devices = 2\n", text);
    CHECK_OK(read_train_text(t2, &cfg, &t, &err), &err);
    CHECK(t.batch_size == 8);
    ct_config_free(cfg);
    snprintf(t2, sizeof t2, "%strain.batch_size = 5\n", text);
    CHECK(read_train_text(t2, &cfg, &t, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "t.gin:2:1: batcher.batch_size_per_device = 4 (x 1 devices: 4) and t.gin:7:1: "
                              "train.batch_size = 5 set the batch size differently"),
              "%s", err.msg);
    printf("  error: %s\n", err.msg);
    ct_config_free(cfg);
    // Per device of every process (Trax's batcher is per host): 4 x 2
    // devices x 3 processes; batcher.batch_size, bound, is per process.
    snprintf(t2, sizeof t2, "%strain.n_devices = 2\ntrain.n_processes = 3\n", text);
    CHECK_OK(read_train_text(t2, &cfg, &t, &err), &err);
    CHECK_MSG(t.batch_size == 24, "%lld", (long long)t.batch_size);
    ct_config_free(cfg);
    snprintf(t2, sizeof t2, "%strain.n_devices = 2\ntrain.n_processes = 3\ntrain.batch_size = 8\n", text);
    CHECK(read_train_text(t2, &cfg, &t, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "batcher.batch_size_per_device = 4 (x 2 devices x 3 processes: 24) and t.gin:9:1: "
                              "train.batch_size = 8 set the batch size differently"),
              "%s", err.msg);
    ct_config_free(cfg);
    snprintf(t2, sizeof t2, "%sbatcher.batch_size = 5\ntrain.n_processes = 2\n", text);
    CHECK_OK(read_train_text(t2, &cfg, &t, &err), &err);
    CHECK_MSG(t.batch_size == 10, "%lld", (long long)t.batch_size);
    ct_config_free(cfg);
    // A bound batch_size is rounded as Trax's batch_fn rounds it: down to a
    // multiple of the devices, at least one row each (30 on 4 devices is 28,
    // 3 on 4 is 4). Unrounded, 30 failed at the first step, naming no setting.
    const int bound[] = {30, 3, 8}, n_dev[] = {4, 4, 4}, want[] = {28, 4, 8};
    for (int i = 0; i < 3; i++) {
        snprintf(t2, sizeof t2, "%sbatcher.batch_size = %d\ntrain.n_devices = %d\n", text, bound[i], n_dev[i]);
        CHECK_OK(read_train_text(t2, &cfg, &t, &err), &err);
        CHECK_MSG(t.batch_size == want[i], "batch_size %d on %d devices: %lld", bound[i], n_dev[i],
                  (long long)t.batch_size);
        ct_config_free(cfg);
    }

    // The batches: train of 4 (shuffled epochs of the train files), eval of
    // eval_batch_size 3 from the t10k files, in order.
    cfg = parse_cfg("b.gin", text, &err);
    ct_stream *train = NULL, *eval = NULL;
    CHECK_OK(ct_config_build_inputs(cfg, "batcher", 4, 1, &train, &eval, &err), &err);
    if (train && eval) {
        ct_batch b;
        CHECK_OK(ct_stream_next(train, &b, &err), &err);
        CHECK(is_idx_batch(&b, 4));
        int eval_ok = 1;
        for (int step = 0; step < 4; step++) {
            CHECK_OK(ct_stream_next(eval, &b, &err), &err);
            CHECK(is_idx_batch(&b, 3));
            if (b.n != 3) break;
            for (int r = 0; r < 3; r++) eval_ok &= ((int32_t *)b.t[1].data)[r] == ((step * 3 + r) % 6 + 5) % 10;
        }
        CHECK(eval_ok);
    }
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    // On n devices the eval batch is a multiple of n, as Trax's batch_fn
    // makes it: max(3 // n, 1) x n (an eval of 3 rows on 2 devices failed
    // after the first training steps).
    // Each process's eval batch is that; the eval batch is it from every
    // process (2 devices x 3 processes: 2 x 3).
    for (int n_dev = 2; n_dev <= 4; n_dev += 2) {
        for (int n_proc = 1; n_proc <= 3; n_proc += 2) {
            char with_devices[8192];
            snprintf(with_devices, sizeof with_devices, "%strain.n_devices = %d\ntrain.n_processes = %d\n", text, n_dev,
                     n_proc);
            cfg = parse_cfg("b.gin", with_devices, &err);
            CHECK_OK(ct_config_build_inputs(cfg, "batcher", 4 * n_proc, 1, &train, &eval, &err), &err);
            ct_tensor sigs[CT_BATCH_MAX_TENSORS];
            if (eval) ct_stream_signature(eval, sigs);
            CHECK_MSG(eval && sigs[0].shape[0] == (n_dev == 2 ? 2 : 4) * n_proc, "eval batch on %d devices x %d: %lld",
                      n_dev, n_proc, eval ? (long long)sigs[0].shape[0] : -1LL);
            ct_stream_free(train);
            ct_stream_free(eval);
            ct_config_free(cfg);
        }
    }
    // The same data as IDXInputs naming the four files.
    char idx[4096];
    snprintf(idx, sizeof idx,
             "IDXInputs.train_images = '%s'\nIDXInputs.train_labels = '%s'\n"
             "IDXInputs.eval_images = '%s'\nIDXInputs.eval_labels = '%s'\n",
             tmp_file("train-images-idx3-ubyte"), tmp_file("train-labels-idx1-ubyte"),
             tmp_file("t10k-images-idx3-ubyte"), tmp_file("t10k-labels-idx1-ubyte"));
    {
        ct_config *c1 = parse_cfg("b.gin", text, &err), *c2 = parse_cfg("i.gin", idx, &err);
        ct_stream *t1 = NULL, *e1 = NULL, *t2s = NULL, *e2 = NULL;
        CHECK_OK(ct_config_build_inputs(c1, "batcher", 4, 9, &t1, &e1, &err), &err);
        CHECK_OK(ct_config_build_inputs(c2, "IDXInputs", 4, 9, &t2s, &e2, &err), &err);
        ct_batch a, b;
        if (t1 && t2s) {
            int same = 1;
            for (int step = 0; step < 3; step++) {
                CHECK_OK(ct_stream_next(t1, &a, &err), &err);
                CHECK_OK(ct_stream_next(t2s, &b, &err), &err);
                same &= batches_equal(&a, &b);
            }
            CHECK(same);
        }
        ct_stream_free(t1), ct_stream_free(e1), ct_stream_free(t2s), ct_stream_free(e2);
        ct_config_free(c1), ct_config_free(c2);
    }

    // Errors: a TFDS name ctrax does not have; data_dir None; a directory
    // without the files; a holdout.
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"data_streams.dataset_name = 'lm1b'\ndata_streams.data_dir = '/tmp'\n",
         "d.gin:1:29: data_streams.dataset_name = 'lm1b': ctrax reads no TFDS"},
        {"data_streams.dataset_name = 'mnist'\ndata_streams.data_dir = None\n",
         "d.gin:2:25: data_streams.data_dir = None: ctrax reads 'mnist' from local IDX files"},
        {"data_streams.dataset_name = 'fashion_mnist'\ndata_streams.data_dir = '/nonexistent'\n",
         "d.gin:2:25: data_streams.data_dir = '/nonexistent' holds no train-images-idx3-ubyte or "
         "train-images-idx3-ubyte.gz"},
        {"data_streams.dataset_name = 'mnist'\ndata_streams.data_dir = '/tmp'\ndata_streams.eval_holdout_size = 5\n",
         "d.gin:3:34: data_streams.eval_holdout_size = 5 is not supported"},
        {"batcher.data_streams = @train\n", "d.gin:1:24: batcher.data_streams = @train: ctrax's batcher reads"},
        {"batcher.data_streams = @data_streams()\n",
         "d.gin:1:24: batcher.data_streams = @data_streams(): ctrax's batcher reads @data_streams (as Trax's configs "
         "write it, with no call)"},
        {"batcher.eval_batch_size = 16777216\ntrain.n_processes = 2\n",
         "d.gin:1:1: batcher.eval_batch_size = 16777216 x 2 processes is over 2^24 examples"},
        // Trax's batcher parameters that would change the batches (the ones
        // that only shape its length buckets are read below).
        {"data_streams.dataset_name = 'mnist'\ndata_streams.data_dir = '/tmp'\nbatcher.buckets = ([12288,], [4, 4])\n",
         "d.gin:3:1: batcher.buckets = ([12288], [4, 4]) is not supported by ctrax: explicit buckets give each length"},
        {"data_streams.dataset_name = 'mnist'\ndata_streams.data_dir = '/tmp'\nbatcher.id_to_mask = 0\n",
         "d.gin:3:1: batcher.id_to_mask = 0 is not supported by ctrax: Trax would give targets equal to it weight 0"},
        {"data_streams.dataset_name = 'mnist'\ndata_streams.data_dir = '/tmp'\nbatcher.batch_shuffle_size = 8\n",
         "d.gin:3:1: batcher.batch_shuffle_size = 8 is not supported by ctrax"},
        {"data_streams.dataset_name = 'mnist'\ndata_streams.data_dir = '/tmp'\ndata_streams.input_name = 'targets'\n",
         "d.gin:3:1: data_streams.input_name = 'targets' is not supported by ctrax: it names a TFDS feature"},
        {"data_streams.dataset_name = 'mnist'\ndata_streams.data_dir = '/tmp'\ndata_streams.target_name = 'text'\n",
         "d.gin:3:1: data_streams.target_name = 'text' is not supported by ctrax"},
        // A TFDS name is said first, before any parameter of its pipeline.
        {"data_streams.dataset_name = 't2t_enwik8_l65k'\nbatcher.buckets = ([1025], [8, 1])\n",
         "d.gin:1:29: data_streams.dataset_name = 't2t_enwik8_l65k': ctrax reads no TFDS"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cfg = parse_cfg("d.gin", bad[i].text, &err);
        train = eval = NULL;
        CHECK(ct_config_build_inputs(cfg, "batcher", 4, 1, &train, &eval, &err) != CT_OK && !train && !eval);
        CHECK_MSG(strstr(err.msg, bad[i].want), "'%s' not in: %s", bad[i].want, err.msg);
        printf("  error: %s\n", err.msg);
        ct_config_free(cfg);
    }
    // Trax's bucketing parameters shape only length buckets of
    // variable-length examples: on IDX data (one shape) they have no effect,
    // and are read (never reported unread).
    {
        char with_buckets[4600];
        snprintf(with_buckets, sizeof with_buckets,
                 "%sbatcher.max_eval_length = 2048\nbatcher.bucket_length = 64\n"
                 "batcher.buckets_include_inputs_in_length = True\nbatcher.strict_pad_on_len = True\n",
                 text);
        cfg = parse_cfg("b.gin", with_buckets, &err);
        CHECK_OK(ct_config_build_inputs(cfg, "batcher", 4, 1, &train, &eval, &err), &err);
        CHECK(binding_used(cfg, "batcher", "max_eval_length") && binding_used(cfg, "batcher", "bucket_length") &&
              binding_used(cfg, "batcher", "buckets_include_inputs_in_length") &&
              binding_used(cfg, "batcher", "strict_pad_on_len"));
        ct_stream_free(train);
        ct_stream_free(eval);
        ct_config_free(cfg);
    }
    // train.inputs bound: the inputs win, as in Trax (data_streams is never
    // read, whatever its dataset_name).
    CHECK_OK(read_train_text("train.inputs = @trax.data.inputs.sequence_copy_inputs\n"
                             "data_streams.dataset_name = 'gru_copy'\ndata_streams.data_dir = None\n",
                             &cfg, &t, &err),
             &err);
    CHECK(!strcmp(t.inputs, "sequence_copy_inputs"));
    int unread = 0;
    for (int i = 0; i < ct_config_n_bindings(cfg); i++) {
        ct_config_binding_info bi = ct_config_binding_at(cfg, i);
        unread += !bi.used && !strcmp(bi.name, "data_streams");
    }
    CHECK(unread == 2);
    ct_config_free(cfg);
    // Unbound, dataset_name is its default None: the error names the setting
    // and no place (it said "<default>:1:1:", a file and line that do not exist).
    cfg = parse_cfg("b.gin", "batcher.eval_batch_size = 3\n", &err);
    train = eval = NULL;
    CHECK(ct_config_build_inputs(cfg, "batcher", 4, 1, &train, &eval, &err) == CT_ERR_ARG);
    const char *none = "data_streams.dataset_name = None: ctrax reads no TFDS";
    CHECK_MSG(!strncmp(err.msg, none, strlen(none)), "%s", err.msg);
    ct_config_free(cfg);
    const char *names[] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                           "t10k-labels-idx1-ubyte"};
    remove_tmp(names, 4);
}


// RNNLM with Trax's rnn_cell references (gru_copy.gin's form), the string
// form, the cells' state widths, and its memory plan against the net.
static void test_rnnlm_config(void) {
    ct_error err = {0};
    static const char base[] = "RNNLM.vocab_size = 8\nRNNLM.d_model = 6\nRNNLM.n_layers = 2\nRNNLM.dropout = 0.0\n";
    static const struct {
        const char *cell;
        size_t weights;  // embedding 8x6, 2 cells, Dense 6x8 + 8
    } ok[] = {
        {"RNNLM.rnn_cell = @trax.layers.GRUCell\nRNNLM.rnn_cell_d_state_multiplier = 1\n",
         48 + 2 * (12 * 12 + 12 + 12 * 6 + 6) + 56},
        {"RNNLM.rnn_cell = 'GRUCell'\nRNNLM.rnn_cell_d_state_multiplier = 1\n", 48 + 2 * (12 * 12 + 12 + 12 * 6 + 6) + 56},
        {"RNNLM.rnn_cell = @LSTMCell\n", 48 + 2 * (12 * 24 + 24) + 56},
        {"", 48 + 2 * (12 * 24 + 24) + 56},  // Trax's default: LSTMCell, multiplier 2
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", base, ok[i].cell);
        ct_config *cfg = parse_cfg("r.gin", text, &err);
        ct_layer *model = build_model(cfg, "trax.models.RNNLM", &err);
        CHECK_MSG(model != NULL, "%s", err.msg);
        if (model) {
            ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 2, 5, NULL);
            ct_device dev = ct_device_cpu();
            ct_net net;
            CHECK_OK(ct_net_init(&net, model, &in, 1, ct_key_from_seed(0), &dev, &err), &err);
            CHECK_MSG(net.n_weights == ok[i].weights, "%s: %zu weights, expected %zu", ok[i].cell, net.n_weights,
                      ok[i].weights);
            CHECK(net.out_sigs[0].shape[2] == 8);
            ct_net_free(&net);
            ct_layer_free(model);
        }
        ct_config_free(cfg);
    }
    // Refusals, each at its binding.
    EXPECT_ERROR("r.gin", "RNNLM.rnn_cell = @Adam\n", "r.gin:1:1", "expects a reference to a layer type",
                 "@Adam (an optimizer)");
    EXPECT_ERROR("r.gin", "RNNLM.rnn_cell = @GRUCell()\n", "r.gin:1:1", "RNNLM.rnn_cell");
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"RNNLM.rnn_cell = @GRUCell\n", "r.gin:5:1: RNNLM.rnn_cell_d_state_multiplier"},  // default 2: an LSTM's
        {"RNNLM.rnn_cell = 'SRU'\n", "r.gin:5:1: RNNLM.rnn_cell = 'SRU' is not supported"},
        {"RNNLM.mode = 'predict'\n", "r.gin:5:1: RNNLM.mode = 'predict' is not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", base, bad[i].text);
        ct_config *cfg = parse_cfg("r.gin", text, &err);
        CHECK(build_model(cfg, "RNNLM", &err) == NULL);
        CHECK_MSG(strstr(err.msg, bad[i].want), "'%s' not in: %s", bad[i].want, err.msg);
        printf("  error: %s\n", err.msg);
        ct_config_free(cfg);
    }
    check_estimate("RNNLM(GRUCell)",
                   "RNNLM.vocab_size = 8\nRNNLM.d_model = 16\nRNNLM.n_layers = 2\nRNNLM.dropout = 0.0\n"
                   "RNNLM.rnn_cell = @GRUCell\nRNNLM.rnn_cell_d_state_multiplier = 1\n" COPY_INPUTS(9),
                   "RNNLM", 0, 64);
    check_estimate("RNNLM(LSTMCell)",
                   "RNNLM.vocab_size = 8\nRNNLM.d_model = 16\nRNNLM.n_layers = 1\nRNNLM.dropout = 0.0\n" COPY_INPUTS(9),
                   "RNNLM", 0, 64);
}

// Layers named `name` under l (an activation's name is its Trax name).
static int count_named(const ct_layer *l, const char *name) {
    int n = !strcmp(l->name, name);
    for (int i = 0; i < l->n_sub; i++) n += count_named(l->sub[i], name);
    return n;
}

// The activation references of Trax's configs: ReformerLM.ff_activation,
// TransformerLM.ff_activation and MLP.activation_fn take Relu, Gelu,
// FastGelu, Tanh or Sigmoid as a string or a reference (any module path or
// scope), build that layer in every block, and refuse another name at its
// binding.
static void test_activation_refs(void) {
    ct_error err = {0};
    static const char reformer[] = "ReformerLM.vocab_size = 8\nReformerLM.d_model = 8\nReformerLM.d_ff = 16\n"
                                   "ReformerLM.n_layers = 2\nReformerLM.n_heads = 2\nReformerLM.max_len = 16\n";
    static const char transformer[] = "TransformerLM.d_model = 8\nTransformerLM.n_heads = 2\nTransformerLM.n_layers = 3\n";
    static const char mlp[] = "MLP.layer_widths = [4, 4, 4]\n";
    static const struct {
        const char *model, *base, *binding, *layer;
        int count;  // layers named `layer` the model holds
    } ok[] = {
        {"ReformerLM", reformer, "ReformerLM.ff_activation = @trax.layers.FastGelu\n", "FastGelu", 2},
        {"ReformerLM", reformer, "", "FastGelu", 2},  // Trax's default
        {"ReformerLM", reformer, "ReformerLM.ff_activation = @Relu\n", "Relu", 2},
        {"ReformerLM", reformer, "ReformerLM.ff_activation = @s/Gelu\n", "Gelu", 2},
        {"ReformerLM", reformer, "ReformerLM.ff_activation = 'Tanh'\n", "Tanh", 2},
        {"TransformerLM", transformer, "", "Relu", 3},  // Trax's default
        {"TransformerLM", transformer, "TransformerLM.ff_activation = @trax.layers.Relu\n", "Relu", 3},
        {"TransformerLM", transformer, "TransformerLM.ff_activation = @trax.layers.Gelu\n", "Gelu", 3},
        {"TransformerLM", transformer, "TransformerLM.ff_activation = @s/FastGelu\n", "FastGelu", 3},
        {"TransformerLM", transformer, "TransformerLM.ff_activation = 'Sigmoid'\n", "Sigmoid", 3},
        {"MLP", mlp, "", "Relu", 2},
        {"MLP", mlp, "MLP.activation_fn = @trax.layers.Relu\n", "Relu", 2},
        {"MLP", mlp, "MLP.activation_fn = @trax.layers.Tanh\nMLP.out_activation = True\n", "Tanh", 3},
        {"MLP", mlp, "MLP.activation_fn = 'Gelu'\n", "Gelu", 2},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", ok[i].base, ok[i].binding);
        ct_config *cfg = parse_cfg("a.gin", text, &err);
        ct_layer *model = build_model(cfg, ok[i].model, &err);
        CHECK_MSG(model != NULL, "%s: %s", ok[i].binding, err.msg);
        if (model) {
            int n = count_named(model, ok[i].layer), relu = count_named(model, "Relu");
            CHECK_MSG(n == ok[i].count && (strcmp(ok[i].layer, "Relu") == 0 || relu == 0),
                      "%s %s: %d %s layers (want %d), %d Relu", ok[i].model, ok[i].binding, n, ok[i].layer,
                      ok[i].count, relu);
        }
        ct_layer_free(model);
        ct_config_free(cfg);
    }
    static const struct {
        const char *model, *text, *want;
    } bad[] = {
        {"TransformerLM", "TransformerLM.ff_activation = 'Elu'\n",
         "a.gin:1:1: TransformerLM.ff_activation = 'Elu' is not supported by ctrax: 'Relu', 'Gelu', 'FastGelu', "
         "'Tanh' or 'Sigmoid'"},
        {"TransformerLM", "TransformerLM.ff_activation = 'relu'\n", "a.gin:1:1: TransformerLM.ff_activation = 'relu'"},
        {"MLP", "MLP.activation_fn = 'LogSoftmax'\n",
         "a.gin:1:1: MLP.activation_fn = 'LogSoftmax' is not supported by ctrax: 'Relu', 'Gelu'"},
        {"MLP", "MLP.activation_fn = @GRUCell\n", "a.gin:1:1: MLP.activation_fn = @GRUCell is not supported"},
        {"ReformerLM", "ReformerLM.ff_activation = @GRUCell\n", "ReformerLM.ff_activation = 'GRUCell' is not supported"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ct_config *cfg = parse_cfg("a.gin", bad[i].text, &err);
        CHECK(build_model(cfg, bad[i].model, &err) == NULL);
        CHECK_MSG(strstr(err.msg, bad[i].want), "'%s' not in: %s", bad[i].want, err.msg);
        ct_config_free(cfg);
    }
    EXPECT_ERROR("a.gin", "TransformerLM.ff_activation = @Adam\n", "a.gin:1:1", "expects a reference to a layer type");
}

// The loss a layer gives on a fixed batch: logits (2, 3), targets, weights.
static double small_loss(ct_layer *l) {
    float x[6] = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.5f}, w[2] = {1.0f, 0.5f}, v = NAN;
    int32_t t[2] = {2, 0};
    ct_tensor in[3] = {ct_tensor_2d(CT_DTYPE_F32, 2, 3, x), ct_tensor_1d(CT_DTYPE_I32, 2, t),
                       ct_tensor_1d(CT_DTYPE_F32, 2, w)};
    fixture f;
    if (!fixture_init_ok(&f, l, in, 3, false)) return NAN;
    run_forward(&f, in, ct_key_from_seed(1), &v);
    fixture_free(&f);
    return v;
}

// WeightedCategoryCrossEntropy.label_smoothing (Trax's; None by default):
// a binding reaches the layer (the loss is the C constructor's with that
// value), the operative config records it and builds the same loss when read
// back, None is no smoothing, and a value outside [0, 1] or of another type
// is refused at its binding. Trax's CrossEntropyLoss takes no label_smoothing.
static void test_label_smoothing(void) {
    ct_error err = {0};
    ct_weighted_category_cross_entropy_params p = ct_weighted_category_cross_entropy_default_params();
    CHECK(p.label_smoothing == 0.0f);
    p.label_smoothing = 0.1f;
    ct_layer *want = ct_weighted_category_cross_entropy_new(p), *plain = ct_weighted_category_cross_entropy();
    double v_want = small_loss(want), v_plain = small_loss(plain);
    ct_layer_free(want);
    ct_layer_free(plain);

    const char *text = "trax.layers.WeightedCategoryCrossEntropy.label_smoothing = 0.1\n"
                       "train.loss_fn = @WeightedCategoryCrossEntropy\n";
    ct_config *cfg = parse_cfg("s.gin", text, &err);
    const char *loss_fn = NULL;
    CHECK_OK(ct_config_get_reference(cfg, "train", "loss_fn", NULL, &loss_fn, &err), &err);
    ct_layer *l = loss_fn ? build_layer(cfg, loss_fn, &err) : NULL;
    CHECK_MSG(l != NULL, "%s", err.msg);
    double v = l ? small_loss(l) : NAN;
    if (l) ct_layer_free(l);
    printf("label_smoothing 0.1 from a config: loss %.9g (the C constructor's %.9g; unsmoothed %.9g)\n", v, v_want,
           v_plain);
    CHECK(v == v_want && v != v_plain);
    char *op = ct_config_operative_text(cfg);
    CHECK_MSG(strstr(op, "\nWeightedCategoryCrossEntropy.label_smoothing = 0.1\n") != NULL, "%s", op);
    ct_config *again = parse_cfg("operative.gin", op, &err);
    l = build_layer(again, "WeightedCategoryCrossEntropy", &err);
    CHECK_MSG(l != NULL, "%s", err.msg);
    CHECK(l && small_loss(l) == v);
    if (l) ct_layer_free(l);
    char *op2 = ct_config_operative_text(again);
    CHECK(strstr(op2, "\nWeightedCategoryCrossEntropy.label_smoothing = 0.1\n") != NULL);
    ct_free(op2);
    ct_config_free(again);
    ct_free(op);
    ct_config_free(cfg);

    // None (Trax's default) and unbound: no smoothing; the operative config
    // then says 0.0.
    static const char *const plain_texts[] = {"WeightedCategoryCrossEntropy.label_smoothing = None\n",
                                              "WeightedCategoryCrossEntropy.label_smoothing = 0\n", ""};
    for (int i = 0; i < 3; i++) {
        cfg = parse_cfg("s.gin", plain_texts[i], &err);
        l = build_layer(cfg, "WeightedCategoryCrossEntropy", &err);
        CHECK_MSG(l != NULL && small_loss(l) == v_plain, "'%s': %s", plain_texts[i], err.msg);
        if (l) ct_layer_free(l);
        op = ct_config_operative_text(cfg);
        CHECK_MSG(strstr(op, i == 0 ? "\nWeightedCategoryCrossEntropy.label_smoothing = None\n"
                                    : "\nWeightedCategoryCrossEntropy.label_smoothing = 0.0\n"),
                  "'%s': %s", plain_texts[i], op);
        ct_free(op);
        ct_config_free(cfg);
    }

    EXPECT_ERROR("s.gin", "\nWeightedCategoryCrossEntropy.label_smoothing = 1.5\n", "s.gin:2:1",
                 "WeightedCategoryCrossEntropy.label_smoothing", "must be <= 1, got 1.5");
    EXPECT_ERROR("s.gin", "eval/WeightedCategoryCrossEntropy.label_smoothing = -0.1\n", "s.gin:1:1",
                 "label_smoothing", "must be >= 0, got -0.1");
    EXPECT_ERROR("s.gin", "WeightedCategoryCrossEntropy.label_smoothing = '0.1'\n", "s.gin:1:1",
                 "WeightedCategoryCrossEntropy.label_smoothing expects a float");
    EXPECT_ERROR("s.gin", "CrossEntropyLoss.label_smoothing = 0.1\n", "s.gin:1:1",
                 "CrossEntropyLoss has no parameter 'label_smoothing' (it takes none)");
}

// Many macros and scoped bindings (the lookups go through a hash index that
// grows as they come): each resolves to its own value, a later definition
// replaces an earlier one, and scopes stay apart.
static void test_many_names(void) {
    enum { N = 5000 };
    size_t cap = (size_t)N * 64 + 256, n = 0;
    char *text = malloc(cap);
    for (int i = 0; i < N; i++) n += (size_t)snprintf(text + n, cap - n, "M%d = %d\ns%d/train.steps = %d\n", i, i, i, i + 7);
    n += (size_t)snprintf(text + n, cap - n, "M17 = 170017\ntrain.steps = %%M4999\ntrain.eval_steps = %%M17\n");
    ct_error err = {0};
    ct_config *cfg = parse_cfg("many.gin", text, &err);
    int64_t v = 0;
    CHECK_OK(ct_config_get_int(cfg, "train", "steps", -1, &v, &err), &err);
    CHECK_MSG(v == 4999, "train.steps = %lld, want 4999", (long long)v);
    CHECK_OK(ct_config_get_int(cfg, "train", "eval_steps", -1, &v, &err), &err);
    CHECK_MSG(v == 170017, "train.eval_steps = %lld, want 170017 (M17 redefined)", (long long)v);
    CHECK_OK(ct_config_get_int(cfg, "s0/train", "steps", -1, &v, &err), &err);
    CHECK_MSG(v == 7, "s0/train.steps = %lld, want 7", (long long)v);
    CHECK_OK(ct_config_get_int(cfg, "s4321/train", "steps", -1, &v, &err), &err);
    CHECK_MSG(v == 4328, "s4321/train.steps = %lld, want 4328", (long long)v);
    ct_config_free(cfg);
    free(text);
}

int main(void) {
    find_config_dir();
    test_many_names();
    printf("configs in %s\n", config_dir);
    test_value_types();
    test_realistic();
    test_trax_names();
    test_overrides();
    test_errors();
    test_include_places();
    test_string_escapes();
    test_number_literals();
    test_float32_fields();
    test_value_size_limit();
    test_build();
    test_operative_round_trip();
    test_optimizers();
    test_schedules();
    test_settings();
    test_settings_lists();
    test_synthetic_inputs();
    test_text_inputs();
    test_token_inputs();
    test_idx_inputs();
    test_whole_run();
    test_memory_budget();
    test_memory_budget_idx();
    test_reformer_options();
    test_reformer_attention_types();
    test_train_defaults_from_trax();
    test_trax_defaults_issue14();
    test_batcher_inputs();
    test_trax_shipped_configs();
    test_nested_scopes();
    test_builder_edges();
    test_rnnlm_config();
    test_activation_refs();
    test_label_smoothing();
    test_skip_nonfinite_setting();
    test_fuzz();
    return check_summary("test_config");
}
