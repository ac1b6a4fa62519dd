#include "quintet/core/log.hpp"

#include <atomic>
#include <cstdio>
#include <string>

#include "quintet/core/error.hpp"

namespace quintet {

LogLevel parse_log_level(std::string_view name) {
  if (name == "debug") return LogLevel::debug;
  if (name == "info") return LogLevel::info;
  if (name == "warn" || name == "warning") return LogLevel::warn;
  if (name == "error") return LogLevel::error;
  if (name == "off" || name == "none") return LogLevel::off;
  QUINTET_THROW(InvalidArgument, "unknown log level '{}': expected debug, info, warn, error or off",
                name);
}

namespace log {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::info)};
std::atomic<int> g_rank{-1};
}  // namespace

void set_level(LogLevel level) { g_level.store(static_cast<int>(level)); }
LogLevel level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_rank(int rank) { g_rank.store(rank); }

void write(LogLevel lvl, std::string_view message) {
  static constexpr char kTag[] = {'D', 'I', 'W', 'E', '-'};
  const int rank = g_rank.load();
  std::string line =
      rank >= 0 ? fmt::format("[quintet r{} {}] {}\n", rank, kTag[static_cast<int>(lvl)], message)
                : fmt::format("[quintet {}] {}\n", kTag[static_cast<int>(lvl)], message);
  std::fwrite(line.data(), 1, line.size(), stderr);  // one call per line: lines stay whole
}

}  // namespace log
}  // namespace quintet
