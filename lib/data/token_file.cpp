#include "quintet/data/token_file.hpp"

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "data/internal/format_constants.hpp"
#include "data/internal/mapped_file.hpp"
#include "quintet/core/error.hpp"
#include "quintet/data/checksum.hpp"

namespace quintet::data {

struct TokenFile::Impl {
  std::string path;
  std::string data_path;
  TokenFormat format = TokenFormat::quintet;
  TokenType type = TokenType::u16;
  std::int64_t num_tokens = 0;
  std::uint64_t data_offset = 0;
  std::shared_ptr<detail::MappedFile> map;  // holds the tokens
  const unsigned char* tokens = nullptr;
  std::vector<std::int64_t> document_offsets;
  std::map<std::string, std::string> metadata;
};

namespace {

using detail::MappedFile;

// Throws the bad-data error: the file, the byte offset, then what was expected and found.
template <class... Args>
[[noreturn]] void bad_file(const std::string& path, std::uint64_t offset,
                           fmt::format_string<Args...> f, Args&&... args) {
  QUINTET_THROW(InvalidArgument, "bad token file {}: at byte {}: {}", path, offset,
                fmt::format(f, std::forward<Args>(args)...));
}

template <class T>
T load(const unsigned char* base, std::uint64_t offset) {
  T v;
  std::memcpy(&v, base + offset, sizeof v);
  return v;
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string printable(const unsigned char* p, std::size_t n) {
  std::string out;
  for (std::size_t i = 0; i < n; ++i) {
    if (p[i] >= 32 && p[i] < 127) {
      out += static_cast<char>(p[i]);
    } else {
      out += fmt::format("\\x{:02x}", p[i]);
    }
  }
  return out;
}

// Checks that a file of `found` bytes has exactly `expected` bytes.
void check_size(const std::string& path, std::uint64_t found, std::uint64_t expected,
                const std::string& what) {
  if (found < expected) {
    bad_file(path, found, "payload truncated: expected {} bytes ({}), found a file of {} bytes",
             expected, what, found);
  }
  if (found > expected) {
    bad_file(path, expected,
             "file size disagrees with the header: expected {} bytes ({}), found {} bytes "
             "({} extra)",
             expected, what, found, found - expected);
  }
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const unsigned char* p,
                                                  std::uint64_t offset, std::uint64_t bytes) {
  std::map<std::string, std::string> out;
  std::uint64_t line_start = 0;
  for (std::uint64_t i = 0; i <= bytes; ++i) {
    if (i < bytes && p[offset + i] != '\n') continue;
    if (i > line_start) {
      std::string line(reinterpret_cast<const char*>(p + offset + line_start), i - line_start);
      const auto eq = line.find('=');
      if (eq == std::string::npos || eq == 0) {
        bad_file(path, offset + line_start, "expected a metadata line 'key=value', found '{}'",
                 line);
      }
      out[line.substr(0, eq)] = line.substr(eq + 1);
    }
    line_start = i + 1;
  }
  return out;
}

}  // namespace

std::string_view format_name(TokenFormat format) {
  switch (format) {
    case TokenFormat::quintet:
      return "quintet";
    case TokenFormat::llmc:
      return "llm.c";
    case TokenFormat::megatron:
      return "megatron";
  }
  return "?";
}

std::size_t token_type_size(TokenType type) {
  switch (type) {
    case TokenType::u8:
    case TokenType::i8:
      return 1;
    case TokenType::i16:
    case TokenType::u16:
      return 2;
    case TokenType::i32:
    case TokenType::u32:
    case TokenType::f32:
      return 4;
    case TokenType::i64:
    case TokenType::f64:
      return 8;
  }
  return 0;
}

std::string_view token_type_name(TokenType type) {
  switch (type) {
    case TokenType::u8:
      return "u8";
    case TokenType::i8:
      return "i8";
    case TokenType::i16:
      return "i16";
    case TokenType::u16:
      return "u16";
    case TokenType::i32:
      return "i32";
    case TokenType::u32:
      return "u32";
    case TokenType::i64:
      return "i64";
    case TokenType::f32:
      return "f32";
    case TokenType::f64:
      return "f64";
  }
  return "?";
}

int megatron_dtype_code(TokenType type) {
  switch (type) {
    case TokenType::u8:
      return 1;
    case TokenType::i8:
      return 2;
    case TokenType::i16:
      return 3;
    case TokenType::i32:
      return 4;
    case TokenType::i64:
      return 5;
    case TokenType::f64:
      return 6;
    case TokenType::f32:
      return 7;
    case TokenType::u16:
      return 8;
    case TokenType::u32:
      return 0;
  }
  return 0;
}

// ---- Opening ----

TokenFile TokenFile::open(const std::string& path, const TokenFileOptions& options) {
  if (ends_with(path, ".idx")) return open_megatron(path);
  if (ends_with(path, ".bin") && file_exists(path.substr(0, path.size() - 4) + ".idx")) {
    return open_megatron(path);
  }
  if (!file_exists(path) && file_exists(path + ".idx") && file_exists(path + ".bin")) {
    return open_megatron(path);
  }
  if (ends_with(path, ".qts")) return open_quintet(path, options);
  auto map = std::make_shared<MappedFile>(path);
  if (map->size() >= 8 && std::memcmp(map->data(), detail::kQuintetMagic, 8) == 0) {
    return open_quintet(path, options);
  }
  if (map->size() >= 4) {
    const auto magic = load<std::int32_t>(map->data(), 0);
    if (magic == detail::kLlmcMagicGpt2 || magic == detail::kLlmcMagicLlama3)
      return open_llmc(path);
  }
  bad_file(path, 0,
           "expected a token file: a quintet shard (magic \"QTSHARD\\x00\"), an llm.c shard (int32 "
           "magic {} or {}) or a Megatron dataset (a .idx beside the .bin); found {} bytes "
           "starting \"{}\"",
           detail::kLlmcMagicGpt2, detail::kLlmcMagicLlama3, map->size(),
           printable(map->data(), map->size() < 8 ? map->size() : 8));
}

TokenFile TokenFile::open_quintet(const std::string& path, const TokenFileOptions& options) {
  auto impl = std::make_shared<Impl>();
  impl->path = impl->data_path = path;
  impl->format = TokenFormat::quintet;
  impl->map = std::make_shared<MappedFile>(path);
  const unsigned char* p = impl->map->data();
  const std::uint64_t size = impl->map->size();
  if (size < detail::kQuintetHeaderBytes) {
    bad_file(path, size, "header truncated: expected at least {} bytes, found {}",
             detail::kQuintetHeaderBytes, size);
  }
  if (std::memcmp(p, detail::kQuintetMagic, 8) != 0) {
    bad_file(path, 0, "wrong magic: expected \"QTSHARD\\x00\", found \"{}\"", printable(p, 8));
  }
  const auto version = load<std::uint32_t>(p, 8);
  if (version != detail::kQuintetVersion) {
    bad_file(path, 8, "unsupported version: expected {}, found {}", detail::kQuintetVersion,
             version);
  }
  const auto width = load<std::uint32_t>(p, 12);
  if (width != 2 && width != 4) {
    bad_file(path, 12, "token width: expected 2 (u16) or 4 (u32) bytes, found {}", width);
  }
  impl->type = width == 2 ? TokenType::u16 : TokenType::u32;
  const auto count = load<std::uint64_t>(p, 16);
  const auto docs = load<std::uint64_t>(p, 24);
  const auto meta_bytes = load<std::uint64_t>(p, 32);
  const auto payload = load<std::uint64_t>(p, 40);
  const auto checksum = load<std::uint64_t>(p, 48);
  if (meta_bytes > size) {
    bad_file(path, 32, "metadata size: expected at most the file size {}, found {}", size,
             meta_bytes);
  }
  if (payload != detail::align8(detail::kQuintetHeaderBytes + meta_bytes)) {
    bad_file(path, 40, "payload offset: expected {} (64 + {} metadata bytes, 8-aligned), found {}",
             detail::align8(detail::kQuintetHeaderBytes + meta_bytes), meta_bytes, payload);
  }
  // Sizes that would overflow cannot match any real file: compare in long double first.
  const long double expected_ld = static_cast<long double>(payload) +
                                  8.0L * (static_cast<long double>(docs) + 1) +
                                  static_cast<long double>(width) * count;
  const std::string what =
      fmt::format("{} header bytes, {} document offsets, {} tokens of {} bytes", payload, docs + 1,
                  count, width);
  if (expected_ld > static_cast<long double>(size)) {
    bad_file(path, size, "payload truncated: expected {:.0f} bytes ({}), found a file of {} bytes",
             static_cast<double>(expected_ld), what, size);
  }
  const std::uint64_t expected = payload + 8 * (docs + 1) + width * count;
  check_size(path, size, expected, what);
  if (options.verify_checksum) {
    const std::uint64_t found = xxh64(p + payload, size - payload);
    if (found != checksum) {
      bad_file(path, payload,
               "checksum mismatch over bytes [{}, {}): expected 0x{:016x} (stored at byte 48), "
               "found 0x{:016x}; the file is corrupt, regenerate it",
               payload, size, checksum, found);
    }
  }
  impl->metadata = parse_metadata(path, p, detail::kQuintetHeaderBytes, meta_bytes);
  impl->document_offsets.resize(docs + 1);
  for (std::uint64_t i = 0; i <= docs; ++i) {
    const auto off = load<std::uint64_t>(p, payload + 8 * i);
    const std::uint64_t lo = i == 0 ? 0 : static_cast<std::uint64_t>(impl->document_offsets[i - 1]);
    if (i == 0 && off != 0) {
      bad_file(path, payload, "document offset 0: expected 0, found {}", off);
    }
    if (off < lo || off > count) {
      bad_file(path, payload + 8 * i, "document offset {}: expected a value in [{}, {}], found {}",
               i, lo, count, off);
    }
    if (i == docs && off != count) {
      bad_file(path, payload + 8 * i, "last document offset: expected the token count {}, found {}",
               count, off);
    }
    impl->document_offsets[i] = static_cast<std::int64_t>(off);
  }
  impl->num_tokens = static_cast<std::int64_t>(count);
  impl->data_offset = payload + 8 * (docs + 1);
  impl->tokens = p + impl->data_offset;
  return TokenFile(std::move(impl));
}

TokenFile TokenFile::open_llmc(const std::string& path) {
  auto impl = std::make_shared<Impl>();
  impl->path = impl->data_path = path;
  impl->format = TokenFormat::llmc;
  impl->map = std::make_shared<MappedFile>(path);
  const unsigned char* p = impl->map->data();
  const std::uint64_t size = impl->map->size();
  if (size < detail::kLlmcHeaderBytes) {
    bad_file(path, size, "llm.c header truncated: expected at least {} bytes, found {}",
             detail::kLlmcHeaderBytes, size);
  }
  const auto magic = load<std::int32_t>(p, 0);
  const auto version = load<std::int32_t>(p, 4);
  const auto count = load<std::int32_t>(p, 8);
  if (magic != detail::kLlmcMagicGpt2 && magic != detail::kLlmcMagicLlama3) {
    bad_file(path, 0,
             "wrong llm.c magic: expected {} (GPT-2, uint16) or {} (Llama 3, uint32), "
             "found {}",
             detail::kLlmcMagicGpt2, detail::kLlmcMagicLlama3, magic);
  }
  const bool gpt2 = magic == detail::kLlmcMagicGpt2;
  const std::int32_t want_version = gpt2 ? detail::kLlmcVersionGpt2 : detail::kLlmcVersionLlama3;
  if (version != want_version) {
    bad_file(path, 4, "unsupported llm.c version for magic {}: expected {}, found {}", magic,
             want_version, version);
  }
  if (count < 0) bad_file(path, 8, "token count: expected a value >= 0, found {}", count);
  impl->type = gpt2 ? TokenType::u16 : TokenType::u32;
  const std::uint64_t width = gpt2 ? 2 : 4;
  check_size(path, size, detail::kLlmcHeaderBytes + width * static_cast<std::uint64_t>(count),
             fmt::format("{} header bytes + {} tokens of {} bytes", detail::kLlmcHeaderBytes, count,
                         width));
  impl->num_tokens = count;
  impl->data_offset = detail::kLlmcHeaderBytes;
  impl->tokens = p + impl->data_offset;
  impl->document_offsets = {0, impl->num_tokens};
  return TokenFile(std::move(impl));
}

TokenFile TokenFile::open_megatron(const std::string& path_or_prefix) {
  std::string prefix = path_or_prefix;
  if (ends_with(prefix, ".idx") || ends_with(prefix, ".bin")) prefix.resize(prefix.size() - 4);
  const std::string idx_path = prefix + ".idx";
  const std::string bin_path = prefix + ".bin";
  MappedFile idx(idx_path);
  const unsigned char* p = idx.data();
  const std::uint64_t size = idx.size();
  if (size < detail::kMegatronHeaderBytes) {
    bad_file(idx_path, size,
             "Megatron index header truncated: expected at least {} bytes, "
             "found {}",
             detail::kMegatronHeaderBytes, size);
  }
  if (std::memcmp(p, detail::kMegatronMagic, 9) != 0) {
    bad_file(idx_path, 0, "wrong magic: expected \"MMIDIDX\\x00\\x00\", found \"{}\"",
             printable(p, 9));
  }
  const auto version = load<std::uint64_t>(p, 9);
  if (version != detail::kMegatronVersion) {
    bad_file(idx_path, 9, "unsupported version: expected {}, found {}", detail::kMegatronVersion,
             version);
  }
  const auto code = load<std::uint8_t>(p, 17);
  static constexpr TokenType kByCode[] = {TokenType::u8,  TokenType::u8,  TokenType::i8,
                                          TokenType::i16, TokenType::i32, TokenType::i64,
                                          TokenType::f64, TokenType::f32, TokenType::u16};
  if (code < 1 || code > 8) {
    bad_file(idx_path, 17,
             "dtype code: expected 1..8 (1 u8, 2 i8, 3 i16, 4 i32, 5 i64, 6 f64, "
             "7 f32, 8 u16), found {}",
             code);
  }
  const TokenType type = kByCode[code];
  const std::uint64_t width = token_type_size(type);
  const auto seqs = load<std::uint64_t>(p, 18);
  const auto docs = load<std::uint64_t>(p, 26);
  const long double expected_ld = detail::kMegatronHeaderBytes + 12.0L * seqs + 8.0L * docs;
  if (expected_ld > static_cast<long double>(size)) {
    bad_file(idx_path, size,
             "index truncated: expected {:.0f} bytes (header, {} sequences, {} "
             "document indices), found {}",
             static_cast<double>(expected_ld), seqs, docs, size);
  }
  const std::uint64_t sizes_at = detail::kMegatronHeaderBytes;
  const std::uint64_t pointers_at = sizes_at + 4 * seqs;
  const std::uint64_t docs_at = pointers_at + 8 * seqs;
  check_size(idx_path, size, docs_at + 8 * docs,
             fmt::format("header, {} sequences, {} document indices", seqs, docs));

  auto impl = std::make_shared<Impl>();
  impl->path = prefix;
  impl->data_path = bin_path;
  impl->format = TokenFormat::megatron;
  impl->type = type;
  impl->map = std::make_shared<MappedFile>(bin_path);
  const std::uint64_t bin_size = impl->map->size();
  std::vector<std::int64_t> seq_start(seqs + 1, 0);  // token offset of each sequence
  std::uint64_t end = 0;                             // byte where the previous sequence ended
  for (std::uint64_t i = 0; i < seqs; ++i) {
    const auto n = load<std::int32_t>(p, sizes_at + 4 * i);
    const auto ptr = load<std::int64_t>(p, pointers_at + 8 * i);
    if (n < 0)
      bad_file(idx_path, sizes_at + 4 * i, "sequence {} size: expected >= 0, found {}", i, n);
    if (ptr < 0 || static_cast<std::uint64_t>(ptr) + width * n > bin_size) {
      bad_file(idx_path, pointers_at + 8 * i,
               "sequence {} points past the end of {}: expected bytes [{}, {}) within its {} "
               "bytes",
               i, bin_path, ptr, ptr + static_cast<std::int64_t>(width) * n, bin_size);
    }
    if (static_cast<std::uint64_t>(ptr) != end) {
      bad_file(idx_path, pointers_at + 8 * i,
               "sequence {} pointer: expected {} (sequences stored back to back), found {}", i, end,
               ptr);
    }
    end += width * n;
    seq_start[i + 1] = seq_start[i] + n;
  }
  if (end != bin_size) {
    bad_file(bin_path, end,
             "file size disagrees with the index {}: expected {} bytes ({} "
             "sequences of {}), found {}",
             idx_path, end, seqs, token_type_name(type), bin_size);
  }
  impl->document_offsets.clear();
  for (std::uint64_t j = 0; j < docs; ++j) {
    const auto d = load<std::int64_t>(p, docs_at + 8 * j);
    const std::int64_t lo = j == 0 ? 0 : load<std::int64_t>(p, docs_at + 8 * (j - 1));
    if ((j == 0 && d != 0) || d < lo || d > static_cast<std::int64_t>(seqs)) {
      bad_file(idx_path, docs_at + 8 * j,
               "document index {}: expected a sequence index in [{}, {}]{}, found {}", j,
               j == 0 ? 0 : lo, j == 0 ? 0 : seqs, j == 0 ? " (the first is 0)" : "", d);
    }
    if (j + 1 == docs && d != static_cast<std::int64_t>(seqs)) {
      bad_file(idx_path, docs_at + 8 * j,
               "last document index: expected the sequence count {}, found {}", seqs, d);
    }
    impl->document_offsets.push_back(seq_start[d]);
  }
  if (impl->document_offsets.empty()) impl->document_offsets = {0, seq_start[seqs]};
  impl->num_tokens = seq_start[seqs];
  impl->data_offset = 0;
  impl->tokens = impl->map->data();
  return TokenFile(std::move(impl));
}

// ---- Access ----

const TokenFile::Impl& TokenFile::impl() const {
  QUINTET_CHECK(impl_ != nullptr, "TokenFile used before open()");
  return *impl_;
}
const std::string& TokenFile::path() const { return impl().path; }
TokenFormat TokenFile::format() const { return impl().format; }
TokenType TokenFile::token_type() const { return impl().type; }
std::int64_t TokenFile::num_tokens() const { return impl().num_tokens; }
const std::vector<std::int64_t>& TokenFile::document_offsets() const {
  return impl().document_offsets;
}
const std::map<std::string, std::string>& TokenFile::metadata() const { return impl().metadata; }
const std::string& TokenFile::data_path() const { return impl().data_path; }
std::uint64_t TokenFile::data_offset() const { return impl().data_offset; }

void TokenFile::read(std::int64_t start, std::int64_t count, std::int32_t* out) const {
  const Impl& m = impl();
  QUINTET_CHECK(start >= 0 && count >= 0 && start + count <= m.num_tokens,
                "TokenFile::read of tokens [{}, {}) from {}, which has {} tokens", start,
                start + count, m.path, m.num_tokens);
  const unsigned char* src = m.tokens + static_cast<std::uint64_t>(start) * token_type_size(m.type);
  auto bad_token = [&](std::int64_t i, auto value) {
    QUINTET_THROW(InvalidArgument,
                  "token {} of {} is {}: expected an integer in [0, 2^31) to be "
                  "used as an int32 token id",
                  start + i, m.path, value);
  };
  auto convert = [&](auto tag) {
    using T = decltype(tag);
    for (std::int64_t i = 0; i < count; ++i) {
      T v;
      std::memcpy(&v, src + i * sizeof(T), sizeof(T));
      if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::uint16_t>) {
        out[i] = static_cast<std::int32_t>(v);
      } else if constexpr (std::is_floating_point_v<T>) {
        if (!(v >= 0) || v >= 2147483648.0 || std::floor(v) != v) bad_token(i, v);
        out[i] = static_cast<std::int32_t>(v);
      } else {
        if (v < 0 || static_cast<std::uint64_t>(v) > 2147483647u) bad_token(i, v);
        out[i] = static_cast<std::int32_t>(v);
      }
    }
  };
  switch (m.type) {
    case TokenType::u16: {
      const auto* s = reinterpret_cast<const std::uint16_t*>(src);  // 2-byte aligned in all formats
      if ((reinterpret_cast<std::uintptr_t>(s) & 1u) == 0) {
        for (std::int64_t i = 0; i < count; ++i) out[i] = s[i];
        return;
      }
      convert(std::uint16_t{});
      return;
    }
    case TokenType::u8:
      convert(std::uint8_t{});
      return;
    case TokenType::i8:
      convert(std::int8_t{});
      return;
    case TokenType::i16:
      convert(std::int16_t{});
      return;
    case TokenType::i32:
      convert(std::int32_t{});
      return;
    case TokenType::u32:
      convert(std::uint32_t{});
      return;
    case TokenType::i64:
      convert(std::int64_t{});
      return;
    case TokenType::f32:
      convert(float{});
      return;
    case TokenType::f64:
      convert(double{});
      return;
  }
}

std::int64_t TokenFile::token(std::int64_t i) const {
  std::int32_t v = 0;
  read(i, 1, &v);
  return v;
}

}  // namespace quintet::data
