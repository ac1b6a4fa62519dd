// TokenFile: one file of tokens read through mmap, in any of three formats.
//
//   quintet   Quintet's own shard (.qts). Little-endian, 64-byte header:
//               byte  0  char[8] magic "QTSHARD\0"
//               byte  8  u32 version = 1
//               byte 12  u32 token width in bytes: 2 (u16) or 4 (u32)
//               byte 16  u64 token count N
//               byte 24  u64 document count D
//               byte 32  u64 metadata bytes M
//               byte 40  u64 payload offset P = 64 + M rounded up to a multiple of 8
//               byte 48  u64 checksum: XXH64 (seed 0) of bytes [P, end of file)
//               byte 56  u64 reserved = 0
//             then M bytes of metadata, "key=value\n" lines (UTF-8); at P the payload:
//             u64 document offsets[D + 1] (token index of each document start, then N), then
//             N tokens. File size = P + 8 (D + 1) + width N exactly.
//   llmc      llm.c token shard: 256 int32 header (magic 20240520, version 1, token count) then
//             uint16 tokens; also llm.c's Llama-3 variant (magic 20240801, version 7, uint32).
//   megatron  Megatron-LM indexed dataset: <prefix>.idx ("MMIDIDX\0\0", u64 version 1, u8 dtype
//             code, u64 sequence count S, u64 document-index count D, i32 sizes[S], i64 byte
//             pointers[S], i64 document index[D]) and <prefix>.bin (the tokens of all sequences,
//             back to back).
//
// Every check of a file's structure runs when it is opened (including the quintet checksum over
// the whole payload), and a failure throws InvalidArgument naming the file, the byte offset, what
// was expected and what was found. Once open, reading cannot fail except for a token value that
// does not fit the int32 the loader hands out. A TokenFile is a cheap, copyable handle to an
// immutable mapping; all methods are thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::data {

enum class TokenFormat { quintet, llmc, megatron };
std::string_view format_name(TokenFormat format);

// How tokens are stored in a file (Megatron allows all of these; quintet u16/u32; llm.c u16/u32).
enum class TokenType : std::uint8_t { u8, i8, i16, u16, i32, u32, i64, f32, f64 };
std::size_t token_type_size(TokenType type);  // bytes per token
std::string_view token_type_name(TokenType type);
// Megatron's dtype codes: 1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, 7 f32, 8 u16 (0 if no code).
int megatron_dtype_code(TokenType type);

struct TokenFileOptions {
  // Verify the quintet payload checksum when opening (reads the whole file once).
  bool verify_checksum = true;
};

class TokenFile {
 public:
  TokenFile() = default;

  // Opens path, choosing the format: a path ending in .idx, a .bin with a .idx beside it, or a
  // prefix with <prefix>.idx and <prefix>.bin is Megatron; a .qts path is a quintet shard;
  // otherwise the magic number decides (quintet or llm.c). Throws InvalidArgument for a malformed
  // file, System when unreadable.
  static TokenFile open(const std::string& path, const TokenFileOptions& options = {});
  static TokenFile open_quintet(const std::string& path, const TokenFileOptions& options = {});
  static TokenFile open_llmc(const std::string& path);
  // prefix: the path without .bin/.idx (a path ending in either is accepted too).
  static TokenFile open_megatron(const std::string& prefix);

  bool is_open() const { return impl_ != nullptr; }
  const std::string& path() const;  // as opened (the prefix for Megatron)
  TokenFormat format() const;
  TokenType token_type() const;
  std::int64_t num_tokens() const;
  // Token index of each document start followed by num_tokens() (so size = documents + 1);
  // {0, num_tokens()} for llm.c shards, which mark documents with an end-of-text token instead.
  const std::vector<std::int64_t>& document_offsets() const;
  // Key/value metadata of a quintet shard (empty for the other formats).
  const std::map<std::string, std::string>& metadata() const;
  // The file that holds the tokens and the byte offset of token 0 in it, for readers that do not
  // use the mapping (the naive baseline of examples/03_loader_bench).
  const std::string& data_path() const;
  std::uint64_t data_offset() const;

  // Copies tokens [start, start + count) into out[0..count) as int32. Throws InvalidArgument when
  // the range is outside [0, num_tokens()) or a token is negative, >= 2^31 or not an integer.
  void read(std::int64_t start, std::int64_t count, std::int32_t* out) const;
  // Token i (slow path, for tests and tools); same checks as read().
  std::int64_t token(std::int64_t i) const;

  struct Impl;

 private:
  explicit TokenFile(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
  const Impl& impl() const;
  std::shared_ptr<const Impl> impl_;
};

}  // namespace quintet::data
