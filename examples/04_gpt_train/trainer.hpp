// The program of 04_gpt_train and 05_moe_train: a GPT trained under any dp x tp (+ sp) x cp x pp
// (x ep) layout, on CPUs or GPUs, on the built-in dataset or token shards, with checkpoints and
// per-step metrics. The two programs differ only in their defaults (a train::JobConfig preset:
// 05_moe_train's blocks' MLPs are mixtures of experts, with the MoE flags and telemetry).
#pragma once

#include "quintet/parallel/train/job_config.hpp"

namespace gpt {

struct Trainer {
  const char* program;      // "04_gpt_train": heads the output and the error messages
  const char* description;  // heads --help
  quintet::train::JobConfig defaults;
};

// The whole program: parses the flags into a JobConfig over trainer.defaults, trains, prints.
// Returns the exit status (0, or 2 for a bad flag or any error, which every rank learns of).
int train_main(int argc, char** argv, const Trainer& trainer);

}  // namespace gpt
