// What the two trainers (trainer.c, reversible_trainer.c) share: the batch
// split over local devices along axis 0. Not public.
#ifndef CTRAX_TRAIN_TRAIN_INTERNAL_H
#define CTRAX_TRAIN_TRAIN_INTERNAL_H

#include "ctrax/core/error.h"
#include "ctrax/dist/comm.h"
#include "ctrax/layers/layer.h"

// sigs[i]: what one of n_local devices sees of batch_sigs[i] (axis 0
// divided); an error naming `who` and the item when it does not divide.
ct_status ct_train_device_sigs(const char *who, const ct_tensor *batch_sigs, int n_batch, int n_local, ct_tensor *sigs,
                               ct_error *err);
// A step's batch against the per-device signatures the net was built for:
// same dtypes and ranks, one batch size that divides by n_local.
ct_status ct_train_check_batch(const char *who, const ct_net *net, const ct_tensor *batch, int n_local,
                               ct_error *err);

// After a failure on some process, every process must still call the same
// collectives: each says here whether it failed (one f64 allreduce over
// comm). Returns this process's own error (failed, whose message is in
// err), or, where it did not fail, an error naming `who` and `where` that
// says another process did, or CT_OK when none failed.
ct_status ct_train_agree_on_failure(ct_comm *comm, ct_status failed, const char *who, const char *where,
                                    ct_error *err);

#endif
