// Saving and resuming a run of 04_gpt_train: what goes into a checkpoint (this rank's parameter
// values and optimizer state, the config, the layout, the step and the data position) and the
// check that a resumed run has the configuration that saved it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/data/sampler.hpp"
#include "quintet/nn/parameter.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"
#include "quintet/parallel/data/distributed_optimizer.hpp"
#include "train_config.hpp"

namespace gpt {

// Where a run stands after `step` optimizer steps.
struct RunPosition {
  std::int64_t step = 0;             // steps taken
  quintet::data::SamplerState data;  // the next sample of the global stream
};

// One pipeline stage this rank holds: its parameters and their optimizer.
struct StageState {
  int stage = 0;
  quintet::nn::ParameterStore* store = nullptr;
  quintet::DistributedOptimizer* optimizer = nullptr;
};

// Saves the run after position.step steps into config.save (collective over world). Every rank
// writes the parameter values and optimizer state of its stages (tensors "params",
// "optimizer.*", prefixed "stage<s>." when a rank holds several stages); rank 0 the metadata.
void save_run(const TrainConfig& config, const RunPosition& position,
              const std::vector<StageState>& stages, quintet::Communicator& world,
              const quintet::Stream& stream);

// Restores the latest checkpoint of config.resume into the stages' stores and optimizers and
// returns where it stands, or nothing (a fresh start) when the directory holds none. Throws
// InvalidArgument when the checkpoint's model, layout or batch differ from config (naming the
// field).
std::optional<RunPosition> resume_run(const TrainConfig& config,
                                      const std::vector<StageState>& stages,
                                      quintet::Communicator& world, const quintet::Stream& stream);

}  // namespace gpt
