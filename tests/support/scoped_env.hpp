// ScopedEnv: sets (or, for nullptr, unsets) one environment variable for a scope and restores its
// previous value (or absence) at the end, for tests of a switch read from the environment
// (QUINTET_GROUPED_GEMM, quintet/nn/grouped_linear.hpp). Not thread-safe, as setenv is not.
#pragma once

#include <cstdlib>
#include <string>

namespace test_support {

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = std::getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* value) const {
    if (value == nullptr) {
      unsetenv(name_.c_str());
    } else {
      setenv(name_.c_str(), value, 1);
    }
  }
  std::string name_;
  bool had_ = false;
  std::string old_;
};

}  // namespace test_support
