// Saving and resuming a run of 04_gpt_train or 05_moe_train through the library's Checkpointer:
// what this trainer adds to the run's identity (the dataset, the global batch) and to the
// checkpoint's metadata.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/runtime_config.hpp"
#include "quintet/parallel/train/checkpointer.hpp"
#include "quintet/parallel/train/hf_export.hpp"
#include "quintet/parallel/train/job_config.hpp"

namespace gpt {

// The Checkpointer of dir (--save or --resume) for this run: a resume refuses a
// checkpoint of another model, layout, batch, seed or dataset, naming the field.
quintet::train::Checkpointer checkpointer(const quintet::train::JobConfig& job,
                                          const std::string& dir, quintet::Communicator& world);

// --export-hf's options: --export-dtype, and the tokenizer files (and token ids) of
// --init-from-hf's directory when the run started from one.
quintet::train::HfExportOptions hf_export_options(const quintet::train::JobConfig& job);

// What a checkpoint records beyond the library's part (a JSON object: the run's lr and steps).
std::string run_metadata(const quintet::train::JobConfig& job);

// --exit-during-save: the before_commit hook that kills the process while saving `step` (for the
// test that an interrupted save never replaces a good checkpoint); empty for other steps.
std::function<void()> exit_during_save(const quintet::train::JobConfig& job, std::int64_t step);

// QUINTET_CHECKPOINT_FAULT=<point>[:<rank>] (read by RuntimeConfig, for the tests that a save
// killed midway is never loaded): installs the library's save-point hook that kills this process
// with SIGKILL at that point of every save (on that rank only, if given). Points: "shard",
// "before_commit", "metadata", "rename" (checkpoint.hpp). Nothing when the variable is unset.
void install_checkpoint_fault(const quintet::RuntimeConfig& runtime);

// --inject-fault KIND:STEP:RANK: at the start of step `step` (1-based) on rank `rank`, throws an
// error (throw) or stops this process with SIGSTOP (stop); does nothing elsewhere. For the tests
// that one failing or stopped rank ends the job with its message instead of a hang.
void inject_fault(const quintet::train::JobConfig& job, std::int64_t step, int rank);

}  // namespace gpt
