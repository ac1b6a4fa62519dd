// A read-only memory map of a whole file (RAII). Private to lib/data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace quintet::data::detail {

class MappedFile {
 public:
  enum class Access {
    read_only,      // PROT_READ, shared with the page cache
    copy_on_write,  // private and writable: writes change this process's pages, never the file
  };
  // Maps path; throws System (with errno text, calling the file `kind`) when it cannot be opened
  // or mapped. An empty file maps to data() == nullptr, size() == 0.
  explicit MappedFile(const std::string& path, std::string_view kind = "token file",
                      Access access = Access::read_only);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  // Writable only with Access::copy_on_write.
  unsigned char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  std::string path_;
  unsigned char* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace quintet::data::detail
