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

// The JSON job file as CLI11 reads a config file: one flat object, {"flag-name": value}, whose
// keys must be among `settings` (the configurable flags' names); `runtime` are the runtime's own,
// refused with a pointer to the command line.
class JsonJobFile : public CLI::Config {
 public:
  JsonJobFile(std::vector<std::string> settings, std::vector<std::string> runtime)
      : settings_(std::move(settings)), runtime_(std::move(runtime)) {}

  std::string to_config(const CLI::App* app, bool default_also, bool write_description,
                        std::string prefix) const override;
  std::vector<CLI::ConfigItem> from_config(std::istream& input) const override;

 private:
  std::vector<std::string> settings_;
  std::vector<std::string> runtime_;
};

}  // namespace quintet::train::detail
