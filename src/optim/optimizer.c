// The optimizer interface: dispatch to the vtable of each optimizer.
#include "ctrax/optim/optimizer.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "optim/internal.h"
#include "ctrax/core/log.h"
#include "ctrax/core/memory.h"

ct_optimizer *ct_optimizer_wrap(const ct_optimizer_vtable *vt, const void *params, size_t size) {
    ct_optimizer *o = ct_calloc(1, sizeof *o);
    o->params = ct_malloc(size);
    memcpy(o->params, params, size);
    o->vt = vt;
    return o;
}

size_t ct_optimizer_one_slot(const ct_optimizer *o, const ct_tensor *sig) {
    (void)o;
    return (size_t)ct_tensor_numel(sig);
}

void ct_optimizer_free(ct_optimizer *o) {
    if (!o) return;
    ct_free(o->params);
    ct_free(o);
}

size_t ct_optimizer_slot_floats(const ct_optimizer *o, const ct_tensor *sig) { return o->vt->slot_floats(o, sig); }

void ct_optimizer_init_slots(const ct_optimizer *o, const ct_tensor *sig, float *slots) {
    if (o->vt->init_slots) o->vt->init_slots(o, sig, slots);
}

void ct_optimizer_update(const ct_optimizer *o, int64_t step, float learning_rate, const ct_tensor *sig, float *w,
                         const float *g, float *slots) {
    o->vt->update(o, step, learning_rate, sig, w, g, slots);
}

const char *ct_optimizer_name(const ct_optimizer *o) { return o->vt->name; }

int ct_optimizer_n_params(const ct_optimizer *o) { return o->vt->param_table ? o->vt->n_param_table : 0; }

const char *ct_optimizer_param_name(const ct_optimizer *o, int i) {
    CT_ASSERT(i >= 0 && i < ct_optimizer_n_params(o));
    return o->vt->param_table[i].name;
}

// The entry called name, or NULL with err set to CT_ERR_ARG and a message
// that lists the known names.
static const ct_optimizer_param *find_param(const ct_optimizer *o, const char *name, ct_error *err) {
    int n = ct_optimizer_n_params(o);
    if (!name) {  // e.g. a member of a JSON array where an object was expected
        ct_error_set(err, CT_ERR_ARG, "optimizer %s: a hyperparameter without a name", o->vt->name);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (strcmp(o->vt->param_table[i].name, name) == 0) return &o->vt->param_table[i];
    char known[CT_ERROR_MSG_MAX / 2];
    size_t len = 0;
    known[0] = '\0';
    for (int i = 0; i < n && len < sizeof known; i++)
        len += (size_t)snprintf(known + len, sizeof known - len, "%s%s", i ? ", " : "", o->vt->param_table[i].name);
    ct_error_set(err, CT_ERR_ARG, "optimizer %s has no hyperparameter '%s'; known: %s", o->vt->name, name,
                 n ? known : "(none)");
    return NULL;
}

static float read_param(const ct_optimizer *o, const ct_optimizer_param *d) {
    const char *field = (const char *)o->params + d->offset;
    switch (d->kind) {
    case CT_OPT_PARAM_BOOL: {
        bool b;
        memcpy(&b, field, sizeof b);
        return b ? 1.0f : 0.0f;
    }
    case CT_OPT_PARAM_INT: {
        int i;
        memcpy(&i, field, sizeof i);
        return (float)i;
    }
    case CT_OPT_PARAM_FLOAT:
    default: {
        float f;
        memcpy(&f, field, sizeof f);
        return f;
    }
    }
}

ct_status ct_optimizer_get_param(const ct_optimizer *o, const char *name, float *value, ct_error *err) {
    const ct_optimizer_param *d = find_param(o, name, err);
    if (!d) return CT_ERR_ARG;
    *value = read_param(o, d);
    return CT_OK;
}

// Whether value may be written to d (err says why not).
static ct_status check_value(const ct_optimizer *o, const ct_optimizer_param *d, const char *name, float value,
                             ct_error *err) {
    if (!isfinite(value))
        return ct_error_set(err, CT_ERR_ARG, "optimizer %s: hyperparameter %s = %g is not finite", o->vt->name, name,
                            (double)value);
    if (d->kind == CT_OPT_PARAM_BOOL && value != 0.0f && value != 1.0f)
        return ct_error_set(err, CT_ERR_ARG, "optimizer %s: hyperparameter %s is a boolean (0 or 1), got %g",
                            o->vt->name, name, (double)value);
    if (d->kind == CT_OPT_PARAM_FLOAT && d->min < d->max &&
        (value < d->min || (d->min_open && value <= d->min) || value > d->max || (d->max_open && value >= d->max)))
        return ct_error_set(err, CT_ERR_ARG, "optimizer %s: hyperparameter %s must be in %s%g, %g%s, got %g",
                            o->vt->name, name, d->min_open ? "(" : "[", d->min, d->max, d->max_open ? ")" : "]",
                            (double)value);
    if (d->kind == CT_OPT_PARAM_INT && (value != floorf(value) || value < (float)d->lo || value > (float)d->hi))
        return ct_error_set(err, CT_ERR_ARG,
                            "optimizer %s: hyperparameter %s must be a whole number in [%d, %d], got %g", o->vt->name,
                            name, d->lo, d->hi, (double)value);
    if (d->fixed && value != read_param(o, d))
        return ct_error_set(err, CT_ERR_STATE,
                            "optimizer %s: hyperparameter %s is fixed when the optimizer is made (it decides the slot "
                            "layout); it is %g, asked for %g: make a new optimizer",
                            o->vt->name, name, (double)read_param(o, d), (double)value);
    return CT_OK;
}

static void write_param(ct_optimizer *o, const ct_optimizer_param *d, float value) {
    char *field = (char *)o->params + d->offset;
    switch (d->kind) {
    case CT_OPT_PARAM_BOOL: {
        bool b = value != 0.0f;
        memcpy(field, &b, sizeof b);
        break;
    }
    case CT_OPT_PARAM_INT: {
        int i = (int)value;
        memcpy(field, &i, sizeof i);
        break;
    }
    case CT_OPT_PARAM_FLOAT:
    default:
        memcpy(field, &value, sizeof value);
        break;
    }
}

ct_status ct_optimizer_set_param(ct_optimizer *o, const char *name, float value, ct_error *err) {
    const ct_optimizer_param *d = find_param(o, name, err);
    if (!d) return CT_ERR_ARG;
    CT_TRY(check_value(o, d, name, value, err));
    write_param(o, d, value);
    return CT_OK;
}

// A JSON number as a float: finite and within float's range (converting a
// double beyond it is undefined behavior, not infinity).
static bool json_float(const cJSON *j, float *out) {
    if (!cJSON_IsNumber(j)) return false;
    double v = j->valuedouble;
    if (!isfinite(v) || fabs(v) > (double)FLT_MAX) return false;
    *out = (float)v;
    return true;
}

const char *ct_optimizer_slot_layout(const ct_optimizer *o) { return o->vt->slot_layout ? o->vt->slot_layout(o) : NULL; }

ct_status ct_optimizer_check_json(const ct_optimizer *o, const cJSON *optimizer, const char *what, bool report,
                                  ct_error *err) {
    if (!cJSON_IsObject(optimizer))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: \"optimizer\" is missing or not an object", what);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(optimizer, "name");
    if (!cJSON_IsString(name))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: optimizer.name is missing or not a string", what);
    if (strcmp(name->valuestring, o->vt->name))
        return ct_error_set(err, CT_ERR_STATE, "%s: trained with optimizer %s (optimizer.name), this run uses %s",
                            what, name->valuestring, o->vt->name);
    // The layout the checkpoint's optimizer was made with, where it says.
    const cJSON *layout = cJSON_GetObjectItemCaseSensitive(optimizer, "slot_layout");
    const char *mine = ct_optimizer_slot_layout(o);
    if (layout && !cJSON_IsString(layout))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: optimizer.slot_layout is not a string", what);
    if (layout && !mine)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: optimizer.slot_layout '%.100s': %s has one slot layout only",
                            what, layout->valuestring, o->vt->name);
    if (layout && strcmp(layout->valuestring, mine))
        return ct_error_set(err, CT_ERR_STATE,
                            "%s: optimizer.slot_layout is '%.100s'; this run's %s has %s: its slots cannot be read "
                            "(make the optimizer as that run did, or start over with --restart)",
                            what, layout->valuestring, o->vt->name, mine);
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(optimizer, "params");
    if (!cJSON_IsObject(params))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: optimizer.params is missing or not an object", what);
    // Everything checked before anything is reported.
    for (int pass = 0; pass < (report ? 2 : 1); pass++) {
        const cJSON *p;
        cJSON_ArrayForEach(p, params) {
            float v;
            if (!json_float(p, &v))
                return ct_error_set(err, CT_ERR_FORMAT, "%s: optimizer.params.%s is not a finite number in float range",
                                    what, p->string);
            const ct_optimizer_param *d = find_param(o, p->string, err);
            ct_status s = d ? check_value(o, d, p->string, v, err) : CT_ERR_ARG;
            if (s != CT_OK) {
                ct_error_prefix(err, "%s: optimizer.params.%s", what, p->string);
                return s;
            }
            float now = read_param(o, d);
            const char *gave = !layout && o->vt->layout_change ? o->vt->layout_change(o, d->name, v) : NULL;
            if (gave)
                return ct_error_set(err, CT_ERR_STATE,
                                    "%s: optimizer.params.%s = %g gave %s %s; this run's %s = %g lays the slots "
                                    "out otherwise (resume with %s = %g, or start over with --restart)",
                                    what, d->name, (double)v, o->vt->name, gave, d->name, (double)now, d->name,
                                    (double)v);
            if (pass == 1 && now != v && strcmp(d->name, "learning_rate"))
                ct_log(CT_LOG_INFO, "resuming with %s.%s = %g; %s had %g", o->vt->name, d->name, (double)now, what,
                       (double)v);
        }
    }
    return CT_OK;
}
