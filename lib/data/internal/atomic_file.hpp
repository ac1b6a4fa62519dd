// A file written under a temporary name and renamed over its path when complete (RAII): readers
// see the old file or the whole new one, never a part. Private to lib/data.
#pragma once

#include <cstddef>
#include <cstdio>
#include <string>

namespace quintet::data::detail {

class AtomicFile {
 public:
  // Creates <path>.tmp.<pid>; throws System when it cannot.
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() ran.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends bytes; throws System on a failed write.
  void write(const void* data, std::size_t bytes);
  template <class T>
  void put(T value) {
    write(&value, sizeof value);
  }
  // Closes the file and renames it over path; throws System on failure (the temporary is removed).
  void commit();

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
};

}  // namespace quintet::data::detail
