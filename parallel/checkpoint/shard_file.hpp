// The per-rank shard file of a checkpoint (format in
// include/quintet/parallel/checkpoint/checkpoint.hpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <vector>

#include "quintet/core/error.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"

// QUINTET_CHECK with another ErrorCode than InvalidArgument (System for file trouble, Remote for
// a peer's failure).
#define QUINTET_CHECK_CODE(cond, code, ...) \
  do {                                      \
    if (!(cond)) [[unlikely]] {             \
      QUINTET_THROW(code, __VA_ARGS__);     \
    }                                       \
  } while (0)

namespace quintet::checkpoint {

struct ShardSummary {
  std::uint64_t checksum = 0;  // XXH64 of the file up to its trailer
  std::uint64_t bytes = 0;     // file size
};

// Writes tensors (copied to the host after the work queued on stream) to path and flushes it to
// the disk. mid_write, when given, runs once the header is written (fault tests).
ShardSummary write_shard(const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                         const Stream& stream, const std::function<void()>& mid_write = {});

// A named point of a save (checkpoint.hpp's SavePointHook): calls the installed hook, if any.
// Points of a save, in order: "shard" (rank's shard half written), "before_commit" (every shard
// written and agreed), "metadata" (rank 0: checkpoint.json written, the directory not yet
// renamed), "rename" (rank 0: the directory renamed, `latest` not yet moved).
void save_point(std::string_view point, int rank);

// The tensors a shard holds (ShardIndex: checkpoint.hpp), from its header (v2: the header's
// checksum verified; the payload not read), and where its payload starts.
ShardIndex read_shard_index(const std::filesystem::path& path);
// One tensor's bytes (a CPU tensor), read with pread; v2: its checksum verified.
Tensor read_shard_tensor(const std::filesystem::path& path, const ShardIndex& index,
                         const ShardEntry& entry);
// The whole file's XXH64, checked against its trailer (reads every byte).
std::uint64_t shard_file_checksum(const std::filesystem::path& path);

// Verifies path's checksum (and that it equals expected_checksum), then copies each tensor's
// saved values into it. Every tensor must be present with its dtype and shape.
void read_shard(const std::filesystem::path& path, std::uint64_t expected_checksum,
                const std::vector<NamedTensor>& tensors, const Stream& stream);

}  // namespace quintet::checkpoint
