#include "data/internal/atomic_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "quintet/core/error.hpp"

namespace quintet::data::detail {

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), tmp_(fmt::format("{}.tmp.{}", path_, ::getpid())) {
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (file_ == nullptr) {
    QUINTET_THROW(System,
                  "cannot create {}: {}; check that the directory exists and is "
                  "writable",
                  tmp_, std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (file_ != nullptr) {
    std::fclose(file_);
    std::remove(tmp_.c_str());
  }
}

void AtomicFile::write(const void* data, std::size_t bytes) {
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) {
    QUINTET_THROW(System, "writing {} bytes to {} failed: {}", bytes, tmp_, std::strerror(errno));
  }
}

void AtomicFile::commit() {
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0 || std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp_.c_str());
    QUINTET_THROW(System, "cannot finish writing {}: {}", path_, std::strerror(err));
  }
}

}  // namespace quintet::data::detail
