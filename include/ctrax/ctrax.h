// The whole public API of ctrax in one include.
#ifndef CTRAX_CTRAX_H
#define CTRAX_CTRAX_H

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
#include "ctrax/layers/layer.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/models/models.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/optim/schedules.h"
#include "ctrax/train/checkpoint.h"
#include "ctrax/train/loop.h"
#include "ctrax/train/reversible_trainer.h"
#include "ctrax/train/summary.h"
#include "ctrax/train/trainer.h"

#endif
