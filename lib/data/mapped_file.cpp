#include "data/internal/mapped_file.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "quintet/core/error.hpp"

namespace quintet::data::detail {

MappedFile::MappedFile(const std::string& path, std::string_view kind, Access access)
    : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    QUINTET_THROW(System, "cannot open {} {}: {}", kind, path, std::strerror(errno));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    QUINTET_THROW(System, "cannot stat {} {}: {}", kind, path, std::strerror(err));
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ > 0) {
    // A private writable mapping reserves no swap (MAP_NORESERVE): pages are copied only when
    // written, and a checkpoint larger than memory still maps under strict overcommit.
    void* p = access == Access::read_only ? ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0)
                                          : ::mmap(nullptr, size_, PROT_READ | PROT_WRITE,
                                                   MAP_PRIVATE | MAP_NORESERVE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      QUINTET_THROW(System, "cannot mmap {} {} ({} bytes): {}", kind, path, size_,
                    std::strerror(err));
    }
    data_ = static_cast<unsigned char*>(p);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

}  // namespace quintet::data::detail
