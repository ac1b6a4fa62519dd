// StderrCapture: what the process writes to stderr (fd 2, log lines included) while it lives, for
// tests of warnings. Not thread-safe: one at a time.
#pragma once

#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <string>

// Redirects fd 2 to a temporary file from construction to take() (or destruction).
class StderrCapture {
 public:
  StderrCapture() : file_(std::tmpfile()) {
    if (file_ == nullptr) throw std::runtime_error("StderrCapture: no temporary file");
    std::fflush(stderr);
    saved_ = dup(2);
    dup2(fileno(file_), 2);
  }
  StderrCapture(const StderrCapture&) = delete;
  StderrCapture& operator=(const StderrCapture&) = delete;
  ~StderrCapture() {
    restore();
    std::fclose(file_);
  }
  // Ends the capture and returns what was written.
  std::string take() {
    restore();
    std::string out;
    std::rewind(file_);
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, file_)) > 0;) out.append(buf, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
    saved_ = -1;
  }
  std::FILE* file_;
  int saved_ = -1;
};
