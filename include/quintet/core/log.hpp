// Logging through fmt: levels, a rank prefix once the rank is known, one line per call.
//
//   quintet::log::info("step {} loss {:.4f}", step, loss);   // "[quintet r3 I] step 1 loss 2.3"
//
// The level and the rank are set once (from RuntimeConfig and bootstrap); lines go to stderr and
// are written whole, so lines from several threads do not interleave. Thread-safe.
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace quintet {

enum class LogLevel { debug = 0, info = 1, warn = 2, error = 3, off = 4 };

// Parses "debug", "info", "warn", "error", "off"; throws InvalidArgument otherwise.
LogLevel parse_log_level(std::string_view name);

namespace log {

void set_level(LogLevel level);
LogLevel level();
// Once set (>= 0), every line is prefixed with the rank.
void set_rank(int rank);
void write(LogLevel level, std::string_view message);

template <class... Args>
void debug(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= LogLevel::debug)
    write(LogLevel::debug, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void info(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= LogLevel::info) write(LogLevel::info, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void warn(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= LogLevel::warn) write(LogLevel::warn, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void error(fmt::format_string<Args...> f, Args&&... args) {
  if (level() <= LogLevel::error)
    write(LogLevel::error, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace log
}  // namespace quintet
