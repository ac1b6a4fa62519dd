// The JSON job file (--config FILE): one flat object whose keys are the flags' names without the
// dashes, read by CLI11 as a config file, so the flags given on the command line override it.
#include <nlohmann/json.hpp>

#include <algorithm>

#include "parallel/train/internal/job_flags.hpp"

namespace quintet::train::detail {

std::vector<CLI::ConfigItem> JsonJobFile::from_config(std::istream& input) const {
  nlohmann::json file;
  try {
    file = nlohmann::json::parse(input);
  } catch (const nlohmann::json::exception& e) {
    throw CLI::ConfigError(std::string("the job file is not valid JSON: ") + e.what());
  }
  if (!file.is_object()) {
    throw CLI::ConfigError(
        "the job file must hold one JSON object of settings, {\"flag-name\": value, ...}");
  }
  std::vector<CLI::ConfigItem> items;
  const auto among = [](const std::vector<std::string>& names, const std::string& key) {
    return std::find(names.begin(), names.end(), key) != names.end();
  };
  for (const auto& [key, value] : file.items()) {
    if (among(runtime_, key)) {
      throw CLI::ConfigError("the job file's \"" + key + "\" is a runtime setting: give --" + key +
                             " on the command line (or its QUINTET_ environment variable)");
    }
    if (among(moe_only_, key)) {
      throw CLI::ConfigError("the job file's \"" + key + "\" is a setting of " + kMoeTrainerOnly);
    }
    if (!among(settings_, key)) {
      throw CLI::ConfigError("the job file's \"" + key +
                             "\" is not a setting: its keys are the flags' names without the "
                             "dashes (--help lists them)");
    }
    CLI::ConfigItem item;
    item.name = key;
    if (value.is_string()) {
      item.inputs = {value.get<std::string>()};
    } else if (value.is_boolean() || value.is_number()) {
      item.inputs = {value.dump()};
    } else {
      throw CLI::ConfigError("the job file's \"" + key + "\" holds " + value.dump() +
                             ": expected a string, a number or true/false");
    }
    items.push_back(std::move(item));
  }
  return items;
}

std::string JsonJobFile::to_config(const CLI::App* app, bool default_also, bool,
                                   std::string) const {
  nlohmann::json file = nlohmann::json::object();
  for (const CLI::Option* opt : app->get_options()) {
    if (!opt->get_configurable() || opt->get_lnames().empty()) continue;
    const std::string& name = opt->get_lnames().front();
    if (opt->count() > 0) {
      file[name] = opt->results().empty() ? std::string("true") : opt->results().back();
    } else if (default_also && !opt->get_default_str().empty()) {
      file[name] = opt->get_default_str();
    }
  }
  return file.dump(2) + "\n";
}

}  // namespace quintet::train::detail
