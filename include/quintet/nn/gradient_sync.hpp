// GradientSync: what a schedule tells whoever synchronises a model chunk's gradients across
// replicas during a step (DataParallel implements it; parallel/data_parallel/data_parallel.hpp), so
// that a schedule (the pipeline executor) can start the reductions early without knowing how they
// are done: buckets, all-reduce or reduce-scatter, ZeRO shards are the implementation's.
//
// The step protocol, on the thread that runs backward:
//   begin_step()              before the step's first forward: zero the gradients, new counters;
//   set_last_microbatch(last) before each backward that marks the chunk's gradients: whether no
//                             later backward of this step marks them (its marks may then start
//                             the reductions while the rest of the schedule computes);
//   finish(stream)            after the step's last backward: start what is left and make stream
//                             wait for all of it. The gradients are then reduced (where they lie
//                             afterwards is the implementation's: e.g. ZeRO shards).
// Who calls finish is the step's business (train::finalize_gradients), not the schedule's.
#pragma once

#include "quintet/core/stream.hpp"

namespace quintet::nn {

class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual void begin_step() = 0;
  virtual void set_last_microbatch(bool last) = 0;
  virtual void finish(const Stream& stream) = 0;
};

}  // namespace quintet::nn
