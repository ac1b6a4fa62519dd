#include "shard_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "quintet/data/checksum.hpp"

namespace quintet::checkpoint {

namespace {

constexpr char kMagicV1[8] = {'Q', 'N', 'T', 'C', 'K', 'P', 'T', '1'};
constexpr char kMagic[8] = {'Q', 'N', 'T', 'C', 'K', 'P', 'T', '2'};

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

}  // namespace

namespace {
std::mutex save_point_mutex;
std::shared_ptr<const SavePointHook> save_point_hook;
}  // namespace

void set_save_point_hook(SavePointHook hook) {
  auto next = hook ? std::make_shared<const SavePointHook>(std::move(hook)) : nullptr;
  const std::lock_guard<std::mutex> lock(save_point_mutex);
  save_point_hook = std::move(next);
}

void save_point(std::string_view point, int rank) {
  std::shared_ptr<const SavePointHook> hook;
  {
    const std::lock_guard<std::mutex> lock(save_point_mutex);
    hook = save_point_hook;
  }
  if (hook) (*hook)(point, rank);
}

ShardSummary write_shard(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                         const Stream& stream, const std::function<void()>& mid_write) {
  std::vector<Tensor> host;
  std::string header;
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    host.push_back(host_copy(t.tensor, stream));
    const std::uint64_t sum = data::xxh64(host.back().data_ptr(), host.back().nbytes());
    header += fmt::format("{} {} {} {} {} {:016x}\n", t.name, dtype_name(t.tensor.dtype()),
                          dims_text(t.tensor.shape()), offset, host.back().nbytes(), sum);
    offset += host.back().nbytes();
  }
  const std::uint64_t header_sum = data::xxh64(header.data(), header.size());
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
  put(&header_sum, sizeof header_sum);
  if (mid_write) mid_write();
  for (const Tensor& h : host) {
    if (h.nbytes() > 0) put(h.data_ptr(), h.nbytes());
  }
  const std::uint64_t checksum = hash.digest();
  write_all(fd, &checksum, sizeof checksum, path);
  const bool synced = ::fsync(fd) == 0;
  ::close(fd);
  QUINTET_CHECK_CODE(synced, System, "checkpoint: cannot flush {}", path.string());
  return {checksum, sizeof kMagic + sizeof header_bytes + header.size() + sizeof header_sum +
                        offset + sizeof checksum};
}

namespace {

// Parses a header (v1: 5 fields a line; v2: 6, the last the tensor's XXH64).
std::vector<ShardEntry> parse_header(const std::string& text, bool v2, std::uint64_t payload_bytes,
                                     const std::filesystem::path& path) {
  std::vector<ShardEntry> out;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    ShardEntry e;
    std::string dtype, dims, sum;
    fields >> e.name >> dtype >> dims >> e.offset >> e.bytes;
    if (v2) fields >> sum;
    QUINTET_CHECK_CODE(!fields.fail(), System, "checkpoint: shard {} has a bad header line '{}'",
                       path.string(), line);
    e.dtype = parse_dtype(dtype);
    if (dims != "-") {
      std::istringstream ds(dims);
      std::string d;
      while (std::getline(ds, d, ',')) e.shape.push_back(std::stoll(d));
    }
    if (v2) {
      e.checksum = std::stoull(sum, nullptr, 16);
      e.has_checksum = true;
    }
    QUINTET_CHECK_CODE(
        e.offset + e.bytes <= payload_bytes &&
            e.bytes == static_cast<std::uint64_t>(shape_numel(e.shape)) * dtype_size(e.dtype),
        System,
        "checkpoint: shard {}: tensor {} ({} bytes at {}) lies outside the payload "
        "of {} bytes or does not match its shape: the file is truncated or corrupt",
        path.string(), e.name, e.bytes, e.offset, payload_bytes);
    out.push_back(std::move(e));
  }
  return out;
}

// Reads n bytes at offset of fd, all of them.
void pread_all(int fd, void* data, std::size_t n, std::uint64_t offset,
               const std::filesystem::path& path) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    QUINTET_CHECK_CODE(got > 0, System, "checkpoint: cannot read {} at byte {}: {}", path.string(),
                       offset, got == 0 ? "end of file" : std::strerror(errno));
    p += got;
    n -= static_cast<std::size_t>(got);
    offset += static_cast<std::uint64_t>(got);
  }
}

struct OpenShard {
  int fd = -1;
  ~OpenShard() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

ShardIndex read_shard_index(const std::filesystem::path& path) {
  OpenShard f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  QUINTET_CHECK_CODE(f.fd >= 0, System, "checkpoint: cannot open shard {}: {}", path.string(),
                     std::strerror(errno));
  const off_t size = ::lseek(f.fd, 0, SEEK_END);
  char magic[8] = {};
  std::uint64_t header_bytes = 0;
  constexpr std::uint64_t kLead = sizeof magic + sizeof header_bytes;
  QUINTET_CHECK_CODE(size >= static_cast<off_t>(kLead + sizeof(std::uint64_t)), System,
                     "checkpoint: {} is not a Quintet checkpoint shard ({} bytes)", path.string(),
                     static_cast<std::int64_t>(size));
  pread_all(f.fd, magic, sizeof magic, 0, path);
  const bool v2 = std::memcmp(magic, kMagic, 8) == 0;
  QUINTET_CHECK_CODE(v2 || std::memcmp(magic, kMagicV1, 8) == 0, System,
                     "checkpoint: {} is not a Quintet checkpoint shard (bad magic)", path.string());
  pread_all(f.fd, &header_bytes, sizeof header_bytes, sizeof magic, path);
  const std::uint64_t fixed = kLead + (v2 ? 2 : 1) * sizeof(std::uint64_t);
  QUINTET_CHECK_CODE(header_bytes <= static_cast<std::uint64_t>(size) - fixed, System,
                     "checkpoint: shard {} has a bad header length {} ({} bytes): truncated or "
                     "corrupt",
                     path.string(), header_bytes, static_cast<std::int64_t>(size));
  std::string header(header_bytes, '\0');
  pread_all(f.fd, header.data(), header.size(), kLead, path);
  ShardIndex index;
  index.payload_offset = kLead + header_bytes;
  if (v2) {
    std::uint64_t stored = 0;
    pread_all(f.fd, &stored, sizeof stored, kLead + header_bytes, path);
    const std::uint64_t actual = data::xxh64(header.data(), header.size());
    QUINTET_CHECK_CODE(actual == stored, System,
                       "checkpoint: shard {} has a corrupt header: XXH64 {:016x}, the file says "
                       "{:016x}",
                       path.string(), actual, stored);
    index.payload_offset += sizeof stored;
  }
  index.file_bytes = static_cast<std::uint64_t>(size);
  index.entries = parse_header(header, v2, index.file_bytes - fixed - header_bytes, path);
  return index;
}

Tensor read_shard_tensor(const std::filesystem::path& path, const ShardIndex& index,
                         const ShardEntry& entry) {
  OpenShard f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  QUINTET_CHECK_CODE(f.fd >= 0, System, "checkpoint: cannot open shard {}: {}", path.string(),
                     std::strerror(errno));
  Tensor out = Tensor::empty(entry.shape, entry.dtype, Device::cpu());
  if (entry.bytes > 0) {
    pread_all(f.fd, out.data_ptr(), entry.bytes, index.payload_offset + entry.offset, path);
  }
  if (entry.has_checksum) {
    const std::uint64_t actual = data::xxh64(out.data_ptr(), entry.bytes);
    QUINTET_CHECK_CODE(actual == entry.checksum, System,
                       "checkpoint: shard {}: tensor {} is corrupt: XXH64 {:016x}, the header "
                       "says {:016x}",
                       path.string(), entry.name, actual, entry.checksum);
  }
  return out;
}

std::uint64_t shard_file_checksum(const std::filesystem::path& path) {
  OpenShard f;
  f.fd = ::open(path.c_str(), O_RDONLY);
  QUINTET_CHECK_CODE(f.fd >= 0, System, "checkpoint: cannot open shard {}: {}", path.string(),
                     std::strerror(errno));
  const off_t size = ::lseek(f.fd, 0, SEEK_END);
  std::uint64_t stored = 0;
  QUINTET_CHECK_CODE(size >= static_cast<off_t>(sizeof stored), System,
                     "checkpoint: shard {} is truncated ({} bytes)", path.string(),
                     static_cast<std::int64_t>(size));
  const std::uint64_t body = static_cast<std::uint64_t>(size) - sizeof stored;
  pread_all(f.fd, &stored, sizeof stored, body, path);
  // Streamed in blocks: a shard may be many GiB.
  data::Xxh64 hash;
  std::vector<char> block(std::size_t{8} << 20);
  for (std::uint64_t at = 0; at < body;) {
    const std::size_t n =
        static_cast<std::size_t>(std::min<std::uint64_t>(block.size(), body - at));
    pread_all(f.fd, block.data(), n, at, path);
    hash.update(block.data(), n);
    at += n;
  }
  const std::uint64_t actual = hash.digest();
  QUINTET_CHECK_CODE(actual == stored, System,
                     "checkpoint: shard {} is corrupt: XXH64 {:016x}, its trailer says {:016x}",
                     path.string(), actual, stored);
  return actual;
}

void read_shard(const std::filesystem::path& path, std::uint64_t expected_checksum,
                const std::vector<NamedTensor>& tensors, const Stream& stream) {
  const std::uint64_t actual = shard_file_checksum(path);
  QUINTET_CHECK_CODE(actual == expected_checksum, System,
                     "checkpoint: shard {} is corrupt: XXH64 {:016x}, checkpoint.json says {:016x}",
                     path.string(), actual, expected_checksum);
  const ShardIndex index = read_shard_index(path);
  std::map<std::string, const ShardEntry*> entries;
  for (const ShardEntry& e : index.entries) entries[e.name] = &e;
  for (const auto& t : tensors) {
    const auto it = entries.find(t.name);
    QUINTET_CHECK(it != entries.end(), "load_checkpoint: {} has no tensor named {} ({} saved)",
                  path.string(), t.name, entries.size());
    const ShardEntry& saved = *it->second;
    QUINTET_CHECK(saved.dtype == t.tensor.dtype() && saved.shape == t.tensor.shape(),
                  "load_checkpoint: {}: tensor {} was saved as {} {}, the model has {} {}; resume "
                  "with the configuration that saved it",
                  path.string(), t.name, dtype_name(saved.dtype), shape_str(saved.shape),
                  dtype_name(t.tensor.dtype()), shape_str(t.tensor.shape()));
    const Tensor src = read_shard_tensor(path, index, saved);
    Tensor dst = t.tensor;
    dst.copy_(src, stream);
    if (dst.device().is_cuda()) stream.synchronize();
  }
}

}  // namespace quintet::checkpoint
