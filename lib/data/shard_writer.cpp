#include "quintet/data/shard_writer.hpp"

#include <cstring>

#include "data/internal/atomic_file.hpp"
#include "data/internal/format_constants.hpp"
#include "quintet/core/error.hpp"
#include "quintet/data/checksum.hpp"

namespace quintet::data {

using detail::AtomicFile;

namespace {

std::vector<std::int64_t> checked_documents(const std::vector<std::int64_t>& offsets,
                                            std::int64_t count) {
  if (offsets.empty()) return {0, count};
  QUINTET_CHECK(offsets.front() == 0 && offsets.back() == count,
                "document offsets must start at 0 and end at the token count {}; got {} .. {}",
                count, offsets.front(), offsets.back());
  for (std::size_t i = 1; i < offsets.size(); ++i) {
    QUINTET_CHECK(offsets[i] >= offsets[i - 1],
                  "document offsets must not decrease; offset {} is {} after {}", i, offsets[i],
                  offsets[i - 1]);
  }
  return offsets;
}

void check_fits(const std::uint32_t* tokens, std::int64_t count, TokenType type,
                const std::string& path) {
  std::uint64_t max = 0;
  switch (type) {
    case TokenType::u8:
      max = 0xff;
      break;
    case TokenType::i8:
      max = 0x7f;
      break;
    case TokenType::i16:
      max = 0x7fff;
      break;
    case TokenType::u16:
      max = 0xffff;
      break;
    case TokenType::i32:
      max = 0x7fffffff;
      break;
    case TokenType::f32:
      max = 1u << 24;
      break;  // exactly representable integers
    default:
      max = 0xffffffffu;
      break;
  }
  for (std::int64_t i = 0; i < count; ++i) {
    QUINTET_CHECK(tokens[i] <= max,
                  "writing {}: token {} is {}, which does not fit {} (max {}); "
                  "use a wider token type",
                  path, i, tokens[i], token_type_name(type), max);
  }
}

// Appends count tokens converted to type to a byte buffer.
void append_tokens(std::vector<unsigned char>& out, const std::uint32_t* tokens, std::int64_t count,
                   TokenType type) {
  const std::size_t width = token_type_size(type);
  const std::size_t at = out.size();
  out.resize(at + width * static_cast<std::size_t>(count));
  unsigned char* dst = out.data() + at;
  auto store = [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t i = 0; i < count; ++i) {
      const T v = static_cast<T>(tokens[i]);
      std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
    }
  };
  switch (type) {
    case TokenType::u8:
      store(std::uint8_t{});
      break;
    case TokenType::i8:
      store(std::int8_t{});
      break;
    case TokenType::i16:
      store(std::int16_t{});
      break;
    case TokenType::u16:
      store(std::uint16_t{});
      break;
    case TokenType::i32:
      store(std::int32_t{});
      break;
    case TokenType::u32:
      store(std::uint32_t{});
      break;
    case TokenType::i64:
      store(std::int64_t{});
      break;
    case TokenType::f32:
      store(float{});
      break;
    case TokenType::f64:
      store(double{});
      break;
  }
}

}  // namespace

void write_quintet_shard(const std::string& path, const std::uint32_t* tokens, std::int64_t count,
                         const QuintetShardOptions& options) {
  QUINTET_CHECK(count >= 0, "write_quintet_shard: token count {} < 0", count);
  QUINTET_CHECK(options.token_type == TokenType::u16 || options.token_type == TokenType::u32,
                "write_quintet_shard: token type must be u16 or u32, got {}",
                token_type_name(options.token_type));
  check_fits(tokens, count, options.token_type, path);
  const std::vector<std::int64_t> docs = checked_documents(options.document_offsets, count);
  std::string meta;
  for (const auto& [key, value] : options.metadata) {
    QUINTET_CHECK(!key.empty() && key.find_first_of("=\n") == std::string::npos &&
                      value.find('\n') == std::string::npos,
                  "metadata key '{}' / value '{}': keys need no '=' or newline, values no newline",
                  key, value);
    meta += key + "=" + value + "\n";
  }
  const std::uint64_t payload_offset = detail::align8(detail::kQuintetHeaderBytes + meta.size());

  std::vector<unsigned char> payload(8 * docs.size());
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const auto v = static_cast<std::uint64_t>(docs[i]);
    std::memcpy(payload.data() + 8 * i, &v, 8);
  }
  append_tokens(payload, tokens, count, options.token_type);

  AtomicFile f(path);
  f.write(detail::kQuintetMagic, 8);
  f.put<std::uint32_t>(detail::kQuintetVersion);
  f.put<std::uint32_t>(static_cast<std::uint32_t>(token_type_size(options.token_type)));
  f.put<std::uint64_t>(static_cast<std::uint64_t>(count));
  f.put<std::uint64_t>(docs.size() - 1);
  f.put<std::uint64_t>(meta.size());
  f.put<std::uint64_t>(payload_offset);
  f.put<std::uint64_t>(xxh64(payload.data(), payload.size()));
  f.put<std::uint64_t>(0);
  f.write(meta.data(), meta.size());
  const char zeros[8] = {};
  f.write(zeros, payload_offset - detail::kQuintetHeaderBytes - meta.size());
  f.write(payload.data(), payload.size());
  f.commit();
}

void write_llmc_shard(const std::string& path, const std::uint32_t* tokens, std::int64_t count,
                      TokenType token_type) {
  QUINTET_CHECK(count >= 0 && count <= 0x7fffffff,
                "write_llmc_shard: token count {} must be in [0, 2^31) (an int32 header field)",
                count);
  QUINTET_CHECK(token_type == TokenType::u16 || token_type == TokenType::u32,
                "write_llmc_shard: token type must be u16 (GPT-2) or u32 (Llama 3), got {}",
                token_type_name(token_type));
  check_fits(tokens, count, token_type, path);
  const bool gpt2 = token_type == TokenType::u16;
  std::int32_t header[256] = {};
  header[0] = gpt2 ? detail::kLlmcMagicGpt2 : detail::kLlmcMagicLlama3;
  header[1] = gpt2 ? detail::kLlmcVersionGpt2 : detail::kLlmcVersionLlama3;
  header[2] = static_cast<std::int32_t>(count);
  std::vector<unsigned char> body;
  append_tokens(body, tokens, count, token_type);
  AtomicFile f(path);
  f.write(header, sizeof header);
  f.write(body.data(), body.size());
  f.commit();
}

void write_megatron_dataset(const std::string& prefix, const std::uint32_t* tokens,
                            std::int64_t count, const std::vector<std::int64_t>& document_offsets,
                            TokenType token_type) {
  QUINTET_CHECK(count >= 0, "write_megatron_dataset: token count {} < 0", count);
  const int code = megatron_dtype_code(token_type);
  QUINTET_CHECK(code != 0,
                "write_megatron_dataset: Megatron has no dtype code for {}; use i32 or "
                "i64",
                token_type_name(token_type));
  check_fits(tokens, count, token_type, prefix + ".bin");
  const std::vector<std::int64_t> docs = checked_documents(document_offsets, count);
  const std::size_t width = token_type_size(token_type);

  std::vector<unsigned char> bin;
  append_tokens(bin, tokens, count, token_type);
  AtomicFile b(prefix + ".bin");
  b.write(bin.data(), bin.size());

  const std::uint64_t seqs = docs.size() - 1;
  AtomicFile x(prefix + ".idx");
  x.write(detail::kMegatronMagic, 9);
  x.put<std::uint64_t>(detail::kMegatronVersion);
  x.put<std::uint8_t>(static_cast<std::uint8_t>(code));
  x.put<std::uint64_t>(seqs);
  x.put<std::uint64_t>(seqs + 1);  // document index: 0, 1, ..., seqs
  for (std::uint64_t i = 0; i < seqs; ++i) {
    const std::int64_t n = docs[i + 1] - docs[i];
    QUINTET_CHECK(n <= 0x7fffffff,
                  "write_megatron_dataset: document {} has {} tokens; Megatron "
                  "sequence sizes are int32",
                  i, n);
    x.put<std::int32_t>(static_cast<std::int32_t>(n));
  }
  for (std::uint64_t i = 0; i < seqs; ++i)
    x.put<std::int64_t>(docs[i] * static_cast<std::int64_t>(width));
  for (std::uint64_t i = 0; i <= seqs; ++i) x.put<std::int64_t>(static_cast<std::int64_t>(i));
  b.commit();
  x.commit();
}

}  // namespace quintet::data
