#include "shard_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "quintet/data/checksum.hpp"

namespace quintet {

namespace {

constexpr char kMagic[8] = {'Q', 'N', 'T', 'C', 'K', 'P', 'T', '1'};

// A host copy of t, contiguous, readable now.
Tensor host_copy(const Tensor& t, const Stream& stream) {
  if (t.device().is_cuda()) {
    Tensor h = t.contiguous(stream).to(Device::cpu(), stream);
    stream.synchronize();
    return h;
  }
  return t.contiguous();
}

std::string dims_text(const Shape& shape) {
  std::string s;
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(shape[i]);
  }
  return s.empty() ? "-" : s;  // a scalar
}

// Appends bytes to fd, all of them.
void write_all(int fd, const void* data, std::size_t size, const std::filesystem::path& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      QUINTET_THROW(System, "checkpoint: cannot write {}: {}", path.string(), std::strerror(err));
    }
    p += n;
    size -= static_cast<std::size_t>(n);
  }
}

struct Entry {
  DType dtype;
  Shape shape;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
};

}  // namespace

ShardSummary write_shard(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                         const Stream& stream) {
  std::vector<Tensor> host;
  std::string header;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    host.push_back(host_copy(t.tensor, stream));
    header += fmt::format("{} {} {} {} {}\n", t.name, dtype_name(t.tensor.dtype()),
                          dims_text(t.tensor.shape()), offset, host.back().nbytes());
    offset += host.back().nbytes();
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  QUINTET_CHECK_CODE(fd >= 0, System, "checkpoint: cannot create {}: {}", path.string(),
                     std::strerror(errno));
  data::Xxh64 hash;
  auto put = [&](const void* p, std::size_t n) {
    hash.update(p, n);
    write_all(fd, p, n, path);
  };
  const std::uint64_t header_bytes = header.size();
  put(kMagic, sizeof kMagic);
  put(&header_bytes, sizeof header_bytes);
  put(header.data(), header.size());
  for (const Tensor& h : host) {
    if (h.nbytes() > 0) put(h.data_ptr(), h.nbytes());
  }
  const std::uint64_t checksum = hash.digest();
  write_all(fd, &checksum, sizeof checksum, path);
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  QUINTET_CHECK_CODE(synced, System, "checkpoint: cannot flush {}", path.string());
  return {checksum, sizeof kMagic + sizeof header_bytes + header.size() + offset + sizeof checksum};
}

void read_shard(const std::filesystem::path& path, std::uint64_t expected_checksum,
                const std::vector<NamedTensor>& tensors, const Stream& stream) {
  std::ifstream in(path, std::ios::binary);
  QUINTET_CHECK_CODE(in.good(), System, "checkpoint: cannot open shard {}", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  constexpr std::size_t kFixed = sizeof kMagic + 2 * sizeof(std::uint64_t);
  QUINTET_CHECK_CODE(file.size() >= kFixed && std::memcmp(file.data(), kMagic, 8) == 0, System,
                     "checkpoint: {} is not a Quintet checkpoint shard ({} bytes)", path.string(),
                     file.size());
  std::uint64_t stored = 0;
  std::memcpy(&stored, file.data() + file.size() - sizeof stored, sizeof stored);
  const std::uint64_t actual = data::xxh64(file.data(), file.size() - sizeof stored);
  QUINTET_CHECK_CODE(actual == stored && stored == expected_checksum, System,
                     "checkpoint: shard {} is corrupt: XXH64 {:016x}, file says {:016x}, "
                     "checkpoint.json says {:016x}",
                     path.string(), actual, stored, expected_checksum);
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data() + sizeof kMagic, sizeof header_bytes);
  QUINTET_CHECK_CODE(header_bytes <= file.size() - kFixed, System,
                     "checkpoint: shard {} has a bad header length {}", path.string(),
                     header_bytes);
  const char* payload = file.data() + sizeof kMagic + sizeof header_bytes + header_bytes;
  const std::uint64_t payload_bytes = file.size() - kFixed - header_bytes;

  std::map<std::string, Entry> entries;
  std::istringstream lines(file.substr(sizeof kMagic + sizeof header_bytes, header_bytes));
  std::string name, dtype, dims;
  Entry e{};
  while (lines >> name >> dtype >> dims >> e.offset >> e.bytes) {
    e.dtype = parse_dtype(dtype);
    e.shape.clear();
    if (dims != "-") {
      std::istringstream ds(dims);
      std::string d;
      while (std::getline(ds, d, ',')) e.shape.push_back(std::stoll(d));
    }
    QUINTET_CHECK_CODE(e.offset + e.bytes <= payload_bytes, System,
                       "checkpoint: shard {}: tensor {} lies outside the payload", path.string(),
                       name);
    entries[name] = e;
  }
  for (const auto& t : tensors) {
    const auto it = entries.find(t.name);
    QUINTET_CHECK(it != entries.end(), "load_checkpoint: {} has no tensor named {} ({} saved)",
                  path.string(), t.name, entries.size());
    const Entry& saved = it->second;
    QUINTET_CHECK(saved.dtype == t.tensor.dtype() && saved.shape == t.tensor.shape(),
                  "load_checkpoint: {}: tensor {} was saved as {} {}, the model has {} {}; resume "
                  "with the configuration that saved it",
                  path.string(), t.name, dtype_name(saved.dtype), shape_str(saved.shape),
                  dtype_name(t.tensor.dtype()), shape_str(t.tensor.shape()));
    // from_blob borrows the file's bytes; copy_ makes the copy before they go away.
    Tensor src = Tensor::from_blob(const_cast<char*>(payload + saved.offset), saved.shape,
                                   saved.dtype, Device::cpu());
    Tensor dst = t.tensor;
    dst.copy_(src, stream);
    if (dst.device().is_cuda()) stream.synchronize();
  }
}

}  // namespace quintet
