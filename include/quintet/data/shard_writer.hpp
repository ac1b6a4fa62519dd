// Writers for the token file formats of token_file.hpp: Quintet shards, llm.c shards and (for
// tests and conversions) Megatron indexed datasets.
//
// Tokens are passed as uint32 values (count elements, not bytes) and stored at the width the
// format asks for; a token that does not fit that width throws InvalidArgument before anything
// is written. Each file is written to "<path>.tmp.<pid>" and renamed into place, so a reader
// (or another rank generating the same file) never sees a half-written file. Throws System when
// the file cannot be written. Thread-safe for different paths.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "quintet/data/token_file.hpp"

namespace quintet::data {

struct QuintetShardOptions {
  // u16 (2 bytes a token) or u32 (4 bytes).
  TokenType token_type = TokenType::u16;
  // Token index of each document start followed by the token count; empty means one document.
  std::vector<std::int64_t> document_offsets;
  // Written as "key=value\n" lines; keys may not contain '=' or '\n', values not '\n'.
  std::map<std::string, std::string> metadata;
};

// Writes a Quintet shard (format in token_file.hpp), payload checksum included.
void write_quintet_shard(const std::string& path, const std::uint32_t* tokens, std::int64_t count,
                         const QuintetShardOptions& options = {});

// Writes an llm.c shard: token_type u16 gives the GPT-2 layout (magic 20240520, version 1), u32
// the Llama-3 one (magic 20240801, version 7). count must fit the int32 header field.
void write_llmc_shard(const std::string& path, const std::uint32_t* tokens, std::int64_t count,
                      TokenType token_type = TokenType::u16);

// Writes <prefix>.bin and <prefix>.idx, one sequence per document, with Megatron's dtype code of
// token_type (u8, i8, i16, u16, i32, i64, f32 or f64). document_offsets as for quintet shards.
void write_megatron_dataset(const std::string& prefix, const std::uint32_t* tokens,
                            std::int64_t count, const std::vector<std::int64_t>& document_offsets,
                            TokenType token_type = TokenType::u16);

}  // namespace quintet::data
