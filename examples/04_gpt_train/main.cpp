// 04_gpt_train: a GPT trained under any dp x tp (+ sp) x pp x cp layout, on CPUs or GPUs, on the
// built-in dataset or token shards, with checkpoints and per-step metrics. The library does the
// job's flags and checks (train::JobConfig), the model, the step and the checkpoints
// (train::TrainingModel, train::Checkpointer); trainer.cpp adds the dataset and the metrics.
// docs/trainer.md has the short version.
//
//   mpirun -np 4 04_gpt_train --tp 2 --dp 2 --device cpu --steps 200         # CPU, 4 ranks
//   mpirun -np 2 04_gpt_train --dp 2 --layers 24 --hidden 1024 --heads 16 \
//       --seq-len 1024 --micro-batch 8 --global-batch 16 --bench              # two GPUs
//   mpirun -np 4 04_gpt_train --pp 4 --schedule zb-h1 --layers 8 --global-batch 32 --device cpu
//   mpirun -np 4 04_gpt_train --config job.json --steps 50                    # a job file
#include "trainer.hpp"

int main(int argc, char** argv) {
  return gpt::train_main(
      argc, argv,
      {"04_gpt_train", "Train a GPT model under any dp x tp (+sp) layout, on CPU or GPU", {}});
}
