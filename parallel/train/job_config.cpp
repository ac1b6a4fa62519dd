// What the library builds from a JobConfig, and the MoE preset (see job_config.hpp).
#include "quintet/parallel/train/job_config.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>

#include "quintet/core/error.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"  // checkpoint_name

namespace quintet::train {

JobConfig JobConfig::moe_preset() {
  JobConfig job;
  job.model.mlp = model::MlpKind::moe;
  expert::RouterConfig& r = job.model.moe.router;
  r.experts = 8;
  r.top_k = 2;
  r.renormalize = true;  // follows top_k (the --top-k flag): top-1 keeps the raw probability
  r.capacity_factor = 0.0f;
  r.aux_loss_coeff = 0.01f;
  r.z_loss_coeff = 0.001f;
  r.bias_rate = 0.0f;
  job.model.moe.overlap_chunks = 2;
  return job;
}

bool JobConfig::gave(std::string_view flag) const {
  return std::find(given.begin(), given.end(), flag) != given.end();
}

std::int64_t JobConfig::accumulation() const {
  return training.global_batch / (training.micro_batch * parallel.dp);
}

std::int64_t JobConfig::last_step() const {
  return training.stop_at > 0 ? training.stop_at : training.steps;
}

bool JobConfig::evaluates_after(std::int64_t step) const {
  if (validation.data.empty()) return false;
  return step == last_step() || (validation.every > 0 && step % validation.every == 0);
}

bool JobConfig::exports_hf_at(std::int64_t step) const {
  const std::int64_t every = checkpoint.export_hf_every;
  return !checkpoint.export_hf.empty() && (step == last_step() || (every > 0 && step % every == 0));
}

std::string JobConfig::hf_export_dir(std::int64_t step) const {
  if (checkpoint.export_hf_every == 0) return checkpoint.export_hf;
  return (std::filesystem::path(checkpoint.export_hf) / checkpoint::checkpoint_name(step)).string();
}

model::GptConfig JobConfig::gpt_config() const {
  model::GptConfig m = model;
  m.tp_overlap_chunks = tp_overlap ? tp_overlap_chunks : 1;
  return m;
}

pipeline::Schedule JobConfig::pipeline_schedule() const {
  return pipeline::make_schedule(training.schedule, parallel.pp, parallel.vpp,
                                 static_cast<int>(accumulation()));
}

nn::LrSchedule JobConfig::learning_rate_schedule() const {
  nn::LrSchedule s;
  s.kind = training.lr_schedule;
  s.peak_lr = training.lr;
  s.min_lr = training.min_lr;
  s.warmup_steps = training.warmup;
  s.total_steps = training.steps;
  s.decay_fraction = training.decay_fraction;
  return s;
}

nn::AdamWConfig JobConfig::optimizer() const {
  nn::AdamWConfig o;
  o.hyper.lr = training.lr;
  o.hyper.beta1 = 0.9f;
  o.hyper.beta2 = 0.95f;
  o.hyper.eps = 1e-8f;
  o.hyper.weight_decay = training.weight_decay;
  o.max_grad_norm = training.clip;
  return o;
}

data_parallel::DataParallelConfig JobConfig::data_parallel() const {
  data_parallel::DataParallelConfig d;
  d.overlap = training.overlap;
  d.zero_stage = training.zero;
  d.bucket_bytes = std::max<std::int64_t>(
      4, static_cast<std::int64_t>(training.bucket_mb * static_cast<double>(1 << 20)));
  d.first_bucket_bytes = std::min(d.first_bucket_bytes, d.bucket_bytes);
  return d;
}

std::pair<std::int64_t, std::int64_t> JobConfig::traced_steps(std::int64_t start,
                                                              std::int64_t end) const {
  if (observe.trace.empty()) return {1, 0};
  const std::string& steps = observe.trace_steps;
  std::int64_t a = 2, b = 4;
  if (!steps.empty()) {
    const std::size_t colon = steps.find(':');
    bool ok = colon != std::string::npos && colon > 0 && colon + 1 < steps.size();
    if (ok) {
      try {
        std::size_t used_a = 0, used_b = 0;
        a = std::stoll(steps.substr(0, colon), &used_a);
        b = std::stoll(steps.substr(colon + 1), &used_b);
        ok = used_a == colon && used_b == steps.size() - colon - 1;
      } catch (const std::exception&) {
        ok = false;
      }
    }
    QUINTET_CHECK(ok && a >= 1 && a <= b,
                  "--trace-steps {}: expected A:B with 1 <= A <= B (1-based steps, inclusive)",
                  steps);
  }
  return {std::max(a, start + 1), std::min(b, end)};
}

}  // namespace quintet::train
