// A read-only memory map of a whole file (RAII). Private to lib/data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace quintet::data::detail {

class MappedFile {
 public:
  // Maps path read-only; throws System (with errno text) when it cannot be opened or mapped.
  // An empty file maps to data() == nullptr, size() == 0.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  const unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::string path_;
  const unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace quintet::data::detail
