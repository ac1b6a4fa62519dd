// XXH64, the 64-bit xxHash checksum (Yann Collet's specification), used for the payload checksum
// of Quintet token shards. It runs at memory speed, so a shard is verified in full when opened.
// The values equal those of the reference implementation (e.g. Python's xxhash.xxh64).
#pragma once

#include <cstddef>
#include <cstdint>

namespace quintet::data {

// XXH64 of bytes [data, data + bytes) with seed.
std::uint64_t xxh64(const void* data, std::size_t bytes, std::uint64_t seed = 0);

// Streaming XXH64: update() with consecutive pieces, then digest() equals xxh64 of their
// concatenation. Not thread-safe.
class Xxh64 {
 public:
  explicit Xxh64(std::uint64_t seed = 0);
  void update(const void* data, std::size_t bytes);
  std::uint64_t digest() const;

 private:
  std::uint64_t seed_;
  std::uint64_t v_[4];
  unsigned char buffer_[32];
  std::size_t buffered_ = 0;
  std::uint64_t total_ = 0;
};

}  // namespace quintet::data
