// GradientReducer: issues the gradient buckets' reductions for DataParallel (a private part of it;
// the contract is data_parallel.hpp's). A bucket's reduction — an all-reduce (ZeRO stage 0) or a
// reduce-scatter into this rank's shard (stages 1, 2) over its group's communicator — starts when
// its last parameter is marked grad-ready, in bucket order (a bucket ready early waits for those
// before it, so every rank issues the same sequence). Stages 0, 1 reduce in the last microbatch
// only; stage 2 (gradients from an OnDemandGradients) in every microbatch, a round per
// microbatch. finish() issues the rest and makes a stream wait for all of it.
//
// Measurement, through the OverlapMeter given (its window is the step, its origin begin_step()'s
// mark on the compute stream): each reduction is an in_flight interval from its issue (a mark on
// the compute stream) to its completion — GPU: a mark on a side stream made to wait for the
// reduction's Work; CPU: the first time the host saw the Work complete (polled at every grad-ready
// hook and in finish()). Each wait of the compute stream for reductions after backward (finish();
// serialised stage 2 also at the end of each earlier microbatch) is an exposed interval.
//
// Contract: every call on the thread that runs backward; reductions are ordered after the work
// queued on the compute stream. The store, plan, mesh, compute stream, meter and on-demand
// gradients must outlive the reducer; its destructor waits for outstanding reductions.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "on_demand_gradients.hpp"
#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/data_parallel/bucket_plan.hpp"
#include "quintet/parallel/data_parallel/data_parallel.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/overlap/overlap_meter.hpp"

namespace quintet::data_parallel {

class GradientReducer {
 public:
  // zero2 is the ZeRO-2 gradient memory (stage 2 only, else null). Allocates stage 1's padded
  // staging buffers on compute (for buckets whose group size does not divide them).
  GradientReducer(nn::ParameterStore& store, const BucketPlan& plan, const Mesh& mesh,
                  const DataParallelConfig& config, const Stream& compute, OnDemandGradients* zero2,
                  overlap::OverlapMeter& meter);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // A new step (after the gradients were zeroed on compute): the meter's window starts here.
  void begin_step();
  // Before each microbatch (see DataParallel::set_last_microbatch).
  void set_last_microbatch(bool last);
  // Parameter p (index i in the plan) is grad-ready; may issue reductions.
  void on_grad_ready(const nn::Parameter& p, int i);
  // Backward asks for p's gradient (stage 2): binds its bucket b and opens the round.
  void on_grad_needed(const nn::Parameter& p, int b);
  // Issues what is left and makes stream wait for every reduction of the step.
  void finish(const Stream& stream);

  // This step so far: reductions issued and bytes of gradient reduced (padded buckets).
  int reductions() const { return static_cast<int>(launches_.size()); }
  std::int64_t bytes() const { return bytes_; }
  // Stage 1: bucket b's padded staging buffer (undefined when its group size divides it).
  const Tensor& staging(int b) const { return staging_[static_cast<std::size_t>(b)]; }
  // Bytes of staging buffers (kept from step to step).
  std::int64_t staging_bytes() const;

 private:
  struct Launch {  // one issued reduction
    int bucket = 0;
    Work work;
    std::shared_ptr<overlap::OverlapInterval> in_flight;
  };

  void launch(int b);
  void close_round();
  void wait_launches(int from, const Stream& stream);
  void reset_round();
  void poll();

  nn::ParameterStore& store_;
  const BucketPlan& plan_;
  const std::vector<GradientBucket>& buckets_;
  const DataParallelConfig config_;
  const Stream& compute_;
  OnDemandGradients* zero2_;
  overlap::OverlapMeter& meter_;
  bool gpu_ = false;
  Stream side_;  // GPU: waits for each reduction, then records its end mark

  std::vector<Communicator*> comms_;  // per bucket
  std::vector<ReduceOp> ops_;
  std::vector<float> prescale_;  // applied to the bucket's gradient before the reduction
  std::vector<Tensor> staging_;  // stage 1: padded f32 copy when the group size does not divide

  // Per step and round (a round = the reductions of one microbatch; one round for stages 0, 1).
  bool last_microbatch_ = true;
  bool round_open_ = false;      // stage 2: this microbatch has bound or marked a gradient
  bool finishing_ = false;       // finish() is running
  int next_launch_ = 0;          // next bucket to reduce in this round
  std::size_t ready_total_ = 0;  // parameters marked grad-ready in this round
  int first_unseen_ = 0;         // CPU: first launch whose completion has not been observed
  std::vector<int> ready_count_;
  std::vector<char> param_ready_;
  std::vector<Launch> launches_;  // in issue order
  std::vector<std::shared_ptr<overlap::OverlapInterval>> exposed_;
  std::int64_t bytes_ = 0;
};

}  // namespace quintet::data_parallel
