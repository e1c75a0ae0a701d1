// Gin configs and the registry: parsing every value type, Trax's names,
// includes and macros, overrides, the errors (each naming file and line),
// the operative config round trip, building models and optimizers from a
// config, and a fuzz-ish pass over prefixes and mutations of valid configs.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ctrax/config/config.h"
#include "ctrax/core/memory.h"
#include "ctrax/models/models.h"

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
        "# every kind of value, in a list any parameter of type list takes\n"
        "train.metrics = [0x1F, -5, +7, 1_000, 1., .5, 1e-4, -2.5E+3, 0.0,\n"
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
    CHECK_OK(ct_config_get_list(cfg, "train", "metrics", NULL, &l, &err), &err);
    if (!l || l->n != 28) {
        CHECK_MSG(0, "metrics list has %d items", l ? l->n : -1);
        ct_config_free(cfg);
        return;
    }
    const ct_config_value *it = l->items;
    CHECK(l->kind == CT_CONFIG_LIST && !strcmp(l->file, "types.gin") && l->line == 2 && l->col == 17);
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
    sprintf(again_text, "train.metrics = %s\n", gin);
    ct_config *again = ct_config_new();
    CHECK_OK(ct_config_parse_text(again, again_text, strlen(again_text), "again", &err), &err);
    const ct_config_value *l2 = NULL;
    CHECK_OK(ct_config_get_list(again, "train", "metrics", NULL, &l2, &err), &err);
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

    // Ints where floats are expected become floats; integral floats where
    // ints are expected become ints.
    const char *conv = "Adam.eps = 0\ntrain.steps = 1e3\nTransformerLM.n_layers = 2.0\n";
    cfg = ct_config_new();
    CHECK_OK(ct_config_parse_text(cfg, conv, strlen(conv), "conv.gin", &err), &err);
    double eps = 1;
    CHECK_OK(ct_config_get_float(cfg, "Adam", "eps", 1.0, &eps, &err), &err);
    CHECK(eps == 0.0);
    CHECK_OK(ct_config_get_int(cfg, "train", "steps", 1, &steps, &err), &err);
    CHECK(steps == 1000);
    char *op = ct_config_operative_text(cfg);
    CHECK(strstr(op, "Adam.eps = 0.0\n") && strstr(op, "train.steps = 1000\n"));
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

    // An include is relative to the including file, not the working directory.
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
    const char *layers[] = {"WeightedCategoryCrossEntropy", "CrossEntropyLoss", "CategoryAccuracy",
                            "WeightedCategoryAccuracy", "SequenceAccuracy", "L2Loss", "trax.layers.L2Loss"};
    for (int k = 0; k < 7; k++) {
        ct_layer *l = ct_config_build_layer(cfg, layers[k], &err);
        CHECK_MSG(l != NULL, "%s: %s", layers[k], err.msg);
        if (l) ct_layer_free(l);
    }
    CHECK(ct_config_build_model(cfg, "L2Loss", &err) == NULL && strstr(err.msg, "not a model"));
    CHECK(ct_config_build_optimizer(cfg, "TransformerLM", &err) == NULL && strstr(err.msg, "not an optimizer"));
    ct_config_free(cfg);

    // A name in the wrong Trax module says where it lives.
    EXPECT_ERROR("trax.gin", "\ntrax.optimizers.TransformerLM.d_model = 8\n", "trax.gin:2:1",
                 "TransformerLM is in trax.models");

    char *reg = ct_config_registry_text();
    CHECK(strstr(reg, "TransformerLM.d_model = 512") && strstr(reg, "Adam.b2 = 0.999") &&
          strstr(reg, "MLP.layer_widths = [128, 64]") && strstr(reg, "# train.steps = (the program's default)"));
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
    EXPECT_ERROR("e.gin", "TransformerLM.d_model = None\n", "e.gin:1:1", "cannot be None");
    EXPECT_ERROR("e.gin", "TransformerLM.dropout = 1.0\n", "e.gin:1:1", "must be < 1");
    EXPECT_ERROR("e.gin", "TransformerLM.n_heads = 0\n", "e.gin:1:1", "must be >= 1");
    EXPECT_ERROR("e.gin", "TransformerLM.d_model = 4294967296\n", "e.gin:1:1", "fit in a C int");
    // Through a macro: found by validate, at the binding, saying where the value is.
    EXPECT_ERROR("e.gin", "W = 'wide'\n\nTransformerLM.d_model = %W\n", "e.gin:3:1", "expects an int",
                 "the value is at e.gin:1:5");
    EXPECT_ERROR("e.gin", "A = %B\nB = %A\nTransformerLM.d_model = %A\n", "e.gin:", "cycle");
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
    EXPECT_ERROR("s.gin", "= 3\n", "s.gin:1:1", "expected a binding");
    EXPECT_ERROR("s.gin", "train. = 3\n", "s.gin:1:8", "expected a name after '.'");
    EXPECT_ERROR("s.gin", "train.model = @TransformerLM(3)\n", "s.gin:1:30", "takes no arguments");
    EXPECT_ERROR("s.gin", "include base.gin\n", "s.gin:1:9", "expected a quoted file name");
    EXPECT_ERROR("s.gin", "train.steps = -'a'\n", "s.gin:1:16", "expected a number after the sign");
    EXPECT_ERROR("s.gin", "scope/MACRO = 1\n", "s.gin:1:1", "is not a binding");
    {
        char deep[400];
        size_t k = (size_t)snprintf(deep, sizeof deep, "train.metrics = ");
        for (int j = 0; j < 80; j++) deep[k++] = '[';
        deep[k] = '\0';
        EXPECT_ERROR("s.gin", deep, "s.gin:1:", "nested deeper than 64");
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
    ct_layer *model = model_name ? ct_config_build_model(cfg, model_name, &err) : NULL;
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
    ct_optimizer *opt = opt_name ? ct_config_build_optimizer(cfg, opt_name, &err) : NULL;
    CHECK_MSG(opt != NULL, "%s", err.msg);
    if (opt) {
        const ct_adam_params *p = opt->params;
        CHECK(!strcmp(opt->vt->name, "Adam"));
        CHECK(p->b1 == 0.9f && p->b2 == 0.98f && p->eps == 1e-9f && p->weight_decay_rate == 0.0f);
        CHECK(p->learning_rate == ct_adam_default_params().learning_rate);
        ct_optimizer_free(opt);
    }
    // The scoped model: dropout 0 in eval/, everything else shared.
    ct_layer *eval_model = ct_config_build_model(cfg, "eval/TransformerLM", &err);
    CHECK_MSG(eval_model != NULL, "%s", err.msg);
    if (eval_model) ct_layer_free(eval_model);

    // MLP from (64, 32,) on (2, 3, 4) inputs: Flatten, Dense(64), Relu, Dense(32).
    ct_layer *mlp = ct_config_build_model(cfg, "MLP", &err);
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
    ct_optimizer *sgd = ct_config_build_optimizer(cfg, "trax.optimizers.SGD", &err);
    CHECK(sgd && ((const ct_sgd_params *)sgd->params)->learning_rate == ct_sgd_default_params().learning_rate);
    if (sgd) ct_optimizer_free(sgd);
    ct_config_free(cfg);

    // The registry's defaults are the C structs' defaults.
    cfg = ct_config_new();
    model = ct_config_build_model(cfg, "TransformerLM", &err);
    CHECK_MSG(model != NULL, "%s", err.msg);
    if (model) ct_layer_free(model);
    opt = ct_config_build_optimizer(cfg, "Adam", &err);
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
    CHECK(ct_config_build_model(cfg, "TransformerLM", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "bad.gin:3:1") && strstr(err.msg, "does not divide"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
    CHECK(ct_config_build_model(cfg, "MLP", &err) == NULL);
    CHECK_MSG(strstr(err.msg, "bad.gin:5:3") && strstr(err.msg, "layer_widths[1]"), "%s", err.msg);
    printf("  error: %s\n", err.msg);
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
        ct_layer *model = ct_config_build_model(cfg, m, err);
        CHECK_MSG(model != NULL, "%s", err->msg);
        if (model) ct_layer_free(model);
    }
    ct_layer *eval_model = ct_config_build_model(cfg, "eval/TransformerLM", err);
    if (eval_model) ct_layer_free(eval_model);
    if (o) {
        ct_optimizer *opt = ct_config_build_optimizer(cfg, o, err);
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
    const char *types = "train.metrics = [0x1F, -5, 1., .5, 1e-4, 'a\\n' \"b\", True, None, @Adam(), %M,\n"
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

int main(void) {
    find_config_dir();
    printf("configs in %s\n", config_dir);
    test_value_types();
    test_realistic();
    test_trax_names();
    test_overrides();
    test_errors();
    test_build();
    test_operative_round_trip();
    test_fuzz();
    return check_summary("test_config");
}
