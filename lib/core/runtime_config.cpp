#include "quintet/core/runtime_config.hpp"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include "quintet/core/error.hpp"

extern char** environ;

namespace quintet {

namespace {

// Each slot of a flight recorder is ~64 bytes per communicator: a million is already far more
// history than a post-mortem reads.
constexpr std::uint64_t kMaxFlightSize = 1 << 20;

// Environment variables RuntimeConfig keeps: Quintet's own and those of the launchers that
// bootstrap understands (OpenMPI, PMI, SLURM, torchrun-style).
bool is_kept_variable(std::string_view name) {
  static constexpr std::string_view kPrefixes[] = {"QUINTET_", "OMPI_", "PMI_", "PMIX_", "SLURM_"};
  // HOME and XDG_CACHE_HOME: where the built-in dataset lives by default (job_config.hpp).
  static constexpr std::string_view kNames[] = {
      "RANK",        "WORLD_SIZE",           "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
      "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "HOME",       "XDG_CACHE_HOME"};
  for (auto p : kPrefixes) {
    if (name.starts_with(p)) return true;
  }
  for (auto n : kNames) {
    if (name == n) return true;
  }
  return false;
}

std::map<std::string, std::string> read_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    const auto eq = entry.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = entry.substr(0, eq);
    if (is_kept_variable(name)) env.emplace(name, entry.substr(eq + 1));
  }
  return env;
}

DevicePreference parse_device_preference(std::string_view v, std::string_view source) {
  if (v == "cpu") return DevicePreference::cpu;
  if (v == "cuda" || v == "gpu") return DevicePreference::cuda;
  if (v == "auto") return DevicePreference::automatic;
  QUINTET_THROW(InvalidArgument, "{}: unknown device '{}': expected cpu, cuda or auto", source, v);
}

// A number in [lo, hi] (lo itself only when allow_lo), else InvalidArgument saying `expected`.
double parse_double(std::string_view v, std::string_view source, double lo, bool allow_lo,
                    double hi, std::string_view expected) {
  char* end = nullptr;
  const std::string s(v);
  const double d = std::strtod(s.c_str(), &end);
  QUINTET_CHECK(
      !s.empty() && end == s.c_str() + s.size() && (d > lo || (allow_lo && d == lo)) && d <= hi,
      "{}: expected {}, got '{}'", source, expected, v);
  return d;
}

bool parse_bool(std::string_view v, std::string_view source) {
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no" || v.empty()) return false;
  QUINTET_THROW(InvalidArgument, "{}: expected 1 or 0 (true/false, on/off), got '{}'", source, v);
}

std::uint64_t parse_u64(std::string_view v, std::string_view source) {
  std::uint64_t x = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  QUINTET_CHECK(ec == std::errc() && ptr == v.data() + v.size(),
                "{}: expected a non-negative integer, got '{}'", source, v);
  return x;
}

// Applies one setting by its flag name (without dashes); false when the name is not ours.
bool apply(RuntimeConfig& c, std::string_view name, std::string_view value,
           std::string_view source) {
  if (name == "device") {
    c.device = parse_device_preference(value, source);
  } else if (name == "log-level") {
    c.log_level = parse_log_level(value);
    c.log_level_given = true;
  } else if (name == "timeout-s") {
    c.timeout_s = parse_double(value, source, 0.0, false, 1e12, "a positive number of seconds");
  } else if (name == "seed") {
    c.seed = parse_u64(value, source);
  } else if (name == "mpi-idle-start-us") {
    c.mpi_idle_start_us = parse_double(value, source, 0.0, true, 1e6, "0 to 1000000 microseconds");
  } else if (name == "check-collectives") {
    c.check_collectives = parse_bool(value, source);
  } else if (name == "flight-size") {
    const std::uint64_t n = parse_u64(value, source);
    QUINTET_CHECK(n <= kMaxFlightSize, "{}: expected 0 to {} operations, got {}", source,
                  kMaxFlightSize, n);
    c.flight_size = static_cast<std::size_t>(n);
  } else if (name == "flight-dir") {
    QUINTET_CHECK(!value.empty(), "{}: expected a directory, got an empty value", source);
    c.flight_dir = std::string(value);
  } else if (name == "cpu-affinity") {
    QUINTET_CHECK(value == "auto" || value == "none", "{}: expected auto or none, got '{}'", source,
                  value);
    c.cpu_affinity = parse_cpu_affinity(value);
  } else {
    return false;
  }
  return true;
}

}  // namespace

RuntimeConfig RuntimeConfig::from(const std::map<std::string, std::string>& env,
                                  const std::vector<std::string>& args) {
  RuntimeConfig c;
  c.env = env;
  static constexpr std::pair<std::string_view, std::string_view> kEnvFlags[] = {
      {"QUINTET_DEVICE", "device"},
      {"QUINTET_LOG_LEVEL", "log-level"},
      {"QUINTET_TIMEOUT_S", "timeout-s"},
      {"QUINTET_SEED", "seed"},
      {"QUINTET_MPI_IDLE_START_US", "mpi-idle-start-us"},
      {"QUINTET_CHECK_COLLECTIVES", "check-collectives"},
      {"QUINTET_FLIGHT_SIZE", "flight-size"},
      {"QUINTET_FLIGHT_DIR", "flight-dir"},
      {"QUINTET_CPU_AFFINITY", "cpu-affinity"}};
  for (const auto& [var, flag] : kEnvFlags) {
    auto it = env.find(std::string(var));
    if (it != env.end()) apply(c, flag, it->second, var);
  }
  for (std::size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (i == 0 || !a.starts_with("--")) {
      c.remaining_args.push_back(a);
      continue;
    }
    std::string name = a.substr(2), value;
    const auto eq = name.find('=');
    bool inline_value = eq != std::string::npos;
    if (inline_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    static constexpr std::string_view kOurs[] = {
        "device",      "log-level",         "timeout-s",
        "seed",        "mpi-idle-start-us", "check-collectives",
        "flight-size", "flight-dir",        "cpu-affinity"};
    // Switches: present means on; they take no separate value.
    static constexpr std::string_view kSwitches[] = {"check-collectives"};
    bool ours = false;
    for (auto o : kOurs) ours = ours || name == o;
    if (!ours) {
      c.remaining_args.push_back(a);
      continue;
    }
    bool is_switch = false;
    for (auto o : kSwitches) is_switch = is_switch || name == o;
    if (!inline_value && is_switch) {
      value = "1";
    } else if (!inline_value) {
      QUINTET_CHECK(i + 1 < args.size(), "flag --{} needs a value", name);
      value = args[++i];
    }
    apply(c, name, value, "--" + name);
  }
  return c;
}

RuntimeConfig RuntimeConfig::from_env() { return from(read_environment(), {}); }

RuntimeConfig RuntimeConfig::from_args(int argc, const char* const* argv) {
  std::vector<std::string> args(argv, argv + argc);
  return from(read_environment(), args);
}

std::optional<std::string> RuntimeConfig::get_env(const std::string& name) const {
  auto it = env.find(name);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

}  // namespace quintet
