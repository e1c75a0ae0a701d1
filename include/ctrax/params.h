// Parameter lists: one description of each params struct.
//
// Every params struct of the public API (optimizers, schedules, models, the
// program's settings) is written once, as a list of its fields:
//
//   #define CT_ADAM_PARAMS(X) X(FLOAT, learning_rate, 1e-4f, AT_LEAST(0), NONE, "step size") ...
//
// and everything else is generated from that list: the struct
// (CT_PARAM_FIELD), its ct_*_default_params() (CT_PARAM_DEFAULT), the
// optimizer's table of hyperparameters by name (src/optim) and the config
// registry's rows with their gin names, types, ranges and help text
// (src/config/registry.c). Adding a field is one line.
//
// The columns, X(TYPE, name, default, RANGE, FLAGS, doc):
//   TYPE     FLOAT (float), DOUBLE, INT (int), INT64 (int64_t), BOOL,
//            STRING (const char *), ENUM(t) (an enum t, stored as an int),
//            REF(KIND) (const char *: the ctrax name of a configurable of
//            KIND: MODEL, LAYER, OPTIMIZER, SCHEDULE, INPUT; None allowed),
//            LIST (a gin list; UNSTORED only), LIST_OF(KIND) (a gin list of
//            references to configurables of KIND; UNSTORED only)
//   default  a C expression of the field's type; for UNSTORED, gin text
//   RANGE    ANY, AT_LEAST(x), POSITIVE (> 0), UNIT ([0, 1]), UNIT_OPEN ([0, 1)),
//            RANGE(a, b) ([a, b]), checked when a config binds it
//   FLAGS    NONE; FIXED (an optimizer's hyperparameter fixed when it is
//            made); REQUIRED (no default: a config must bind it);
//            NULLABLE (None is accepted and gives the default); UNSTORED
//            (a Trax parameter ctrax accepts only at its default: a row of
//            the registry, no field of the struct); UNSTORED_NULLABLE (one
//            that may be None too)
//   doc      help text (a string literal) or NULL
//
// The bare tokens (FLOAT, AT_LEAST, NONE, ...) are only ever pasted onto a
// prefix (CT_PARAM_CTYPE_##TYPE), never expanded on their own.
#ifndef CTRAX_PARAMS_H
#define CTRAX_PARAMS_H

#include <stdbool.h>
#include <stdint.h>

// The C type of each TYPE.
#define CT_PARAM_CTYPE_FLOAT float
#define CT_PARAM_CTYPE_DOUBLE double
#define CT_PARAM_CTYPE_INT int
#define CT_PARAM_CTYPE_INT64 int64_t
#define CT_PARAM_CTYPE_BOOL bool
#define CT_PARAM_CTYPE_STRING const char *
#define CT_PARAM_CTYPE_ENUM(t) t
#define CT_PARAM_CTYPE_REF(kind) const char *

// Whether an entry is a field of the struct (all but UNSTORED): the field
// macro F(ctype, name, default) or nothing.
#define CT_PARAM_STORED_NONE(F, t, name, def) F(t, name, def)
#define CT_PARAM_STORED_FIXED(F, t, name, def) F(t, name, def)
#define CT_PARAM_STORED_REQUIRED(F, t, name, def) F(t, name, def)
#define CT_PARAM_STORED_NULLABLE(F, t, name, def) F(t, name, def)
#define CT_PARAM_STORED_UNSTORED(F, t, name, def)
#define CT_PARAM_STORED_UNSTORED_NULLABLE(F, t, name, def)

#define CT_PARAM_DECLARE_(t, name, def) t name;
#define CT_PARAM_INIT_(t, name, def) .name = (def),

// X-macros over a list: the struct's fields, and its defaults as a
// designated initializer: (ct_adam_params){CT_ADAM_PARAMS(CT_PARAM_DEFAULT)}.
#define CT_PARAM_FIELD(TYPE, name, def, RANGE, FLAGS, doc) \
    CT_PARAM_STORED_##FLAGS(CT_PARAM_DECLARE_, CT_PARAM_CTYPE_##TYPE, name, def)
#define CT_PARAM_DEFAULT(TYPE, name, def, RANGE, FLAGS, doc) \
    CT_PARAM_STORED_##FLAGS(CT_PARAM_INIT_, CT_PARAM_CTYPE_##TYPE, name, def)

#endif
