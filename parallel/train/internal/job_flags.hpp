// The command-line flags of a JobConfig and the JSON job file they read (job_config_flags.cpp,
// job_config_file.cpp): private to parallel/train.
#pragma once

#include <CLI/CLI.hpp>

#include <istream>
#include <string>
#include <utility>
#include <vector>

#include "quintet/parallel/train/job_config.hpp"

namespace quintet::train::detail {

// Adds --config FILE and every flag of a trainer whose defaults are *job (the MoE flags when
// job->model.mlp is moe) to app, bound to *job: each option's default text is job's value now.
void add_job_flags(CLI::App& app, JobConfig& job);

// The settings of the mixture-of-experts trainer that `dense` (a dense trainer's flags) lacks:
// --ep, --experts, ... by name without the dashes.
std::vector<std::string> moe_only_settings(const CLI::App& dense);

// Why a setting among moe_only_settings is refused, after "--ep is a flag of" or "the job file's
// \"ep\" is a setting of".
inline constexpr const char* kMoeTrainerOnly =
    "the mixture-of-experts trainer (05_moe_train, JobConfig::moe_preset()), and this trainer's "
    "model is dense";

// The JSON job file as CLI11 reads a config file: one flat object, {"flag-name": value}, whose
// keys must be among `settings` (the configurable flags' names); `runtime` are the runtime's own,
// refused with a pointer to the command line, and `moe_only` the MoE trainer's (for a dense
// trainer), refused with a pointer to it.
class JsonJobFile : public CLI::Config {
 public:
  JsonJobFile(std::vector<std::string> settings, std::vector<std::string> runtime,
              std::vector<std::string> moe_only)
      : settings_(std::move(settings)),
        runtime_(std::move(runtime)),
        moe_only_(std::move(moe_only)) {}

  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

 private:
  std::vector<std::string> settings_;
  std::vector<std::string> runtime_;
  std::vector<std::string> moe_only_;
};

}  // namespace quintet::train::detail
