// The whole public API of ctrax in one include.
//
// The one error and ownership rule, followed by every public function:
//
// 1. Anything that can fail returns a ct_status and takes the error last:
//        ct_status f(..., T **out, ct_error *err);
//    err may be NULL (the status is returned either way; ct_error_set and
//    ct_error_prefix accept NULL). A constructor writes the object it made
//    to *out, and on failure leaves *out NULL (set before anything else
//    can fail) with nothing else allocated. The message names the file and
//    the byte or line, the layer path or tensor, or the setting at fault.
//    A call that cannot fail but for memory returns its object directly
//    (layer and model constructors, ct_comm_single_new); their arguments
//    are checked where the object is first used (ct_net_init).
//
// 2. A function that takes ownership of an argument takes it on every path:
//    on success the new object frees it; on any failure, an argument error
//    found before anything was allocated as much as one found late, the
//    function has freed it before it returns. The caller never frees what
//    it handed over. Examples: every stream transform owns the stream it
//    wraps (ct_batch_stream_new(&s, s, ...) frees s when it fails); the
//    trainers and ct_loop_new own the optimizers they are given.
//
// 3. Layers are reference-counted: a constructor returns one reference,
//    which the caller owns (ct_layer_free drops it). Combinators (ct_serial,
//    ...) take over the one reference of each layer passed (pass
//    ct_layer_ref(x) to use x twice). Everything else that keeps a layer
//    takes a new reference of its own (ct_layer_ref) and leaves the
//    caller's alone, on every path: trainers and ct_loop_new reference the
//    model and the losses and metrics, and a failed call has dropped what it
//    took. Each constructor's comment says which arguments it owns, which it
//    references and which it borrows (these must outlive it: a ct_device, a
//    ct_comm, a stream or schedule given to ct_loop_new).
//
// 4. One out-of-memory policy (ctrax/core/memory.h): bookkeeping
//    allocations (structs, names, lists, index tables) go through
//    ct_malloc/ct_calloc/ct_realloc/ct_strdup and abort through the abort
//    handler when memory runs out, since no caller could go on without them;
//    the bytes a run is sized by (weights, gradients, slots, activations: a
//    ct_device's) are checked against the device's limit and the machine's
//    memory before they are allocated and fail with CT_ERR_MEMORY, naming
//    what and how much. Sizes read from files are checked against the file
//    before anything is allocated for them.
#ifndef CTRAX_CTRAX_H
#define CTRAX_CTRAX_H

#include "ctrax/core/blas.h"
#include "ctrax/core/error.h"
#include "ctrax/core/log.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/config/config.h"
#include "ctrax/core/tensor.h"
#include "ctrax/data/stream.h"
#include "ctrax/data/synthetic.h"
#include "ctrax/dist/comm.h"
#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/efficient_attention.h"
#include "ctrax/layers/gradcheck.h"
#include "ctrax/layers/layer.h"
#include "ctrax/layers/lsh_attention.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/layers/rnn.h"
#include "ctrax/models/models.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/optim/schedules.h"
#include "ctrax/train/checkpoint.h"
#include "ctrax/train/evaluator.h"
#include "ctrax/train/loop.h"
#include "ctrax/train/reversible_trainer.h"
#include "ctrax/train/safetensors.h"
#include "ctrax/train/summary.h"
#include "ctrax/train/tensorboard.h"
#include "ctrax/train/trainer.h"

#endif
