// Token file formats: every format round-trips through its writer, and every kind of bad file is
// rejected at open with a message naming the file, the byte offset, what was expected and found.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "support/catch.hpp"

#include "quintet/data/checksum.hpp"
#include "quintet/data/shard_writer.hpp"
#include "quintet/data/token_dataset.hpp"
#include "quintet/data/token_file.hpp"

using namespace quintet;
using namespace quintet::data;

namespace {

std::string temp_dir() {
  static const std::string dir = [] {
    std::string d = (std::filesystem::temp_directory_path() /
                     ("quintet_data_format_" + std::to_string(::getpid())))
                        .string();
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

std::vector<std::uint32_t> random_tokens(std::size_t n, std::uint32_t vocab, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::uint32_t> v(n);
  for (auto& t : v) t = rng() % vocab;
  return v;
}

std::vector<unsigned char> read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<unsigned char>(std::istreambuf_iterator<char>(f), {});
}
void write_all(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
template <class T>
void poke(std::vector<unsigned char>& bytes, std::size_t offset, T value) {
  std::memcpy(bytes.data() + offset, &value, sizeof value);
}

void check_tokens(const TokenFile& f, const std::vector<std::uint32_t>& want) {
  REQUIRE(f.num_tokens() == static_cast<std::int64_t>(want.size()));
  std::vector<std::int32_t> got(want.size());
  f.read(0, static_cast<std::int64_t>(want.size()), got.data());
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != static_cast<std::int32_t>(want[i])) {
      FAIL("token " << i << ": got " << got[i] << ", want " << want[i]);
    }
  }
  // An unaligned sub-range.
  std::vector<std::int32_t> part(7);
  f.read(3, 7, part.data());
  for (int i = 0; i < 7; ++i) CHECK(part[i] == static_cast<std::int32_t>(want[3 + i]));
}

}  // namespace

TEST_CASE("XXH64 matches the reference values, in one piece and streamed") {
  CHECK(xxh64("", 0) == 0xEF46DB3751D8E999ULL);
  CHECK(xxh64("a", 1) == 0xD24EC4F1A98C6E5BULL);
  CHECK(xxh64("abc", 3) == 0x44BC2CF5AD770999ULL);
  const std::vector<std::uint32_t> data = random_tokens(1000, 1u << 31, 1);
  const std::size_t bytes = data.size() * 4;
  const std::uint64_t whole = xxh64(data.data(), bytes, 42);
  for (std::size_t piece : {1, 5, 31, 32, 33, 100}) {
    Xxh64 h(42);
    const auto* p = reinterpret_cast<const unsigned char*>(data.data());
    for (std::size_t at = 0; at < bytes; at += piece) h.update(p + at, std::min(piece, bytes - at));
    CHECK(h.digest() == whole);
  }
}

TEST_CASE("quintet shards round-trip tokens, documents and metadata") {
  for (TokenType type : {TokenType::u16, TokenType::u32}) {
    const std::uint32_t vocab = type == TokenType::u16 ? 65536 : 100000;
    const auto tokens = random_tokens(10007, vocab, 2);
    QuintetShardOptions opt;
    opt.token_type = type;
    opt.document_offsets = {0, 100, 100, 5000, 10007};
    opt.metadata = {{"tokenizer", "gpt2"}, {"entropy_floor_nats", "1.25"}};
    const std::string path = temp_dir() + "/rt_" + std::string(token_type_name(type)) + ".qts";
    write_quintet_shard(path, tokens.data(), static_cast<std::int64_t>(tokens.size()), opt);
    const TokenFile f = TokenFile::open(path);
    CHECK(f.format() == TokenFormat::quintet);
    CHECK(f.token_type() == type);
    check_tokens(f, tokens);
    CHECK(f.document_offsets() == opt.document_offsets);
    CHECK(f.metadata() == opt.metadata);
  }
}

TEST_CASE("llm.c shards round-trip (GPT-2 u16 and Llama-3 u32 layouts)") {
  for (TokenType type : {TokenType::u16, TokenType::u32}) {
    const auto tokens = random_tokens(5003, type == TokenType::u16 ? 50257 : 128256, 3);
    const std::string path = temp_dir() + "/llmc_" + std::string(token_type_name(type)) + ".bin";
    write_llmc_shard(path, tokens.data(), static_cast<std::int64_t>(tokens.size()), type);
    const auto bytes = read_all(path);
    std::int32_t header[3];
    std::memcpy(header, bytes.data(), sizeof header);
    CHECK(header[0] == (type == TokenType::u16 ? 20240520 : 20240801));
    CHECK(header[1] == (type == TokenType::u16 ? 1 : 7));
    CHECK(header[2] == 5003);
    CHECK(bytes.size() == 1024 + token_type_size(type) * 5003);
    const TokenFile f = TokenFile::open(path);
    CHECK(f.format() == TokenFormat::llmc);
    check_tokens(f, tokens);
    CHECK(f.document_offsets() == std::vector<std::int64_t>{0, 5003});
  }
}

TEST_CASE("Megatron datasets round-trip for every dtype, by .bin, .idx or prefix") {
  const std::vector<std::int64_t> docs = {0, 10, 250, 251, 999};
  for (TokenType type : {TokenType::u8, TokenType::i8, TokenType::i16, TokenType::u16,
                         TokenType::i32, TokenType::i64, TokenType::f32, TokenType::f64}) {
    const std::uint32_t vocab = type == TokenType::i8 ? 128 : type == TokenType::u8 ? 256 : 30000;
    const auto tokens = random_tokens(999, vocab, 4);
    const std::string prefix = temp_dir() + "/mega_" + std::string(token_type_name(type));
    write_megatron_dataset(prefix, tokens.data(), 999, docs, type);
    const auto idx = read_all(prefix + ".idx");
    CHECK(std::memcmp(idx.data(), "MMIDIDX\0\0", 9) == 0);
    CHECK(static_cast<int>(idx[17]) == megatron_dtype_code(type));
    for (const std::string& name : {prefix, prefix + ".bin", prefix + ".idx"}) {
      const TokenFile f = TokenFile::open(name);
      INFO(name);
      CHECK(f.format() == TokenFormat::megatron);
      CHECK(f.token_type() == type);
      check_tokens(f, tokens);
      CHECK(f.document_offsets() == docs);
    }
  }
}

TEST_CASE("TokenDataset opens globs and comma lists, Megatron pairs once") {
  const std::string dir = temp_dir() + "/glob";
  std::filesystem::create_directories(dir);
  const auto a = random_tokens(300, 1000, 5), b = random_tokens(200, 1000, 6);
  write_quintet_shard(dir + "/s_000.qts", a.data(), 300);
  write_quintet_shard(dir + "/s_001.qts", b.data(), 200);
  write_megatron_dataset(dir + "/m", b.data(), 200, {});
  const TokenDataset ds = TokenDataset::open(dir + "/s_*.qts," + dir + "/m.*");
  REQUIRE(ds.files().size() == 3);
  CHECK(ds.files()[0].path() == dir + "/s_000.qts");
  CHECK(ds.files()[2].format() == TokenFormat::megatron);
  CHECK(ds.num_tokens() == 700);
  const Windows w(ds, 10);  // (299 / 10) + (199 / 10) + (199 / 10) = 29 + 19 + 19
  CHECK(w.count() == 67);
  std::vector<std::int32_t> tok(10), tgt(10);
  w.read(30, tok.data(), tgt.data());  // second file, window 1: tokens 10..20
  for (int i = 0; i < 10; ++i) {
    CHECK(tok[i] == static_cast<std::int32_t>(b[10 + i]));
    CHECK(tgt[i] == static_cast<std::int32_t>(b[11 + i]));
  }
  REQUIRE_THROWS_QUINTET(TokenDataset::open(dir + "/nothing_*.qts"), InvalidArgument,
                         "matches no file");
  REQUIRE_THROWS_QUINTET(Windows(ds, 1000), InvalidArgument, "no window of 1000 + 1 tokens");
}

TEST_CASE("bad quintet shards are rejected at open with file, offset, expected and found") {
  const auto tokens = random_tokens(1000, 60000, 7);
  QuintetShardOptions opt;
  opt.metadata = {{"k", "v"}};  // 4 bytes: payload at 72
  opt.document_offsets = {0, 400, 1000};
  const std::string good = temp_dir() + "/good.qts";
  write_quintet_shard(good, tokens.data(), 1000, opt);
  const auto bytes = read_all(good);
  const std::string bad = temp_dir() + "/bad.qts";
  auto expect = [&](std::vector<unsigned char> b, const std::string& substring) {
    write_all(bad, b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(bad), InvalidArgument, substring);
    REQUIRE_THROWS_QUINTET(TokenFile::open(bad), InvalidArgument, "bad token file " + bad);
  };
  {
    auto b = bytes;
    b[0] = 'X';
    expect(b, "at byte 0: wrong magic: expected \"QTSHARD\\x00\", found \"XTSHARD\\x00\"");
  }
  {
    auto b = bytes;
    poke<std::uint32_t>(b, 8, 9);
    expect(b, "at byte 8: unsupported version: expected 1, found 9");
  }
  {
    auto b = bytes;
    b.resize(b.size() - 10);
    expect(b,
           fmt::format("at byte {}: payload truncated: expected {} bytes", b.size(), bytes.size()));
  }
  {
    auto b = bytes;
    b.resize(40);
    expect(b, "at byte 40: header truncated: expected at least 64 bytes, found 40");
  }
  {
    auto b = bytes;
    poke<std::uint64_t>(b, 16, 990);  // header says fewer tokens than the file holds
    expect(b, fmt::format("at byte {}: file size disagrees with the header: expected {} bytes",
                          bytes.size() - 20, bytes.size() - 20));
  }
  {
    auto b = bytes;
    b[b.size() - 1] ^= 0x5a;  // one payload byte flipped
    expect(b, "at byte 72: checksum mismatch over bytes [72, ");
  }
  {
    auto b = bytes;
    poke<std::uint64_t>(b, 72 + 8, 1001);  // document offset past the tokens; fix the checksum
    poke<std::uint64_t>(b, 48, xxh64(b.data() + 72, b.size() - 72));
    expect(b, "at byte 80: document offset 1: expected a value in [0, 1000], found 1001");
  }
  {
    auto b = bytes;
    poke<std::uint32_t>(b, 12, 3);
    expect(b, "at byte 12: token width: expected 2 (u16) or 4 (u32) bytes, found 3");
  }
  // Not a token file at all (no extension to go by).
  const std::string junk = temp_dir() + "/junk.dat";
  write_all(junk, {'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'});
  REQUIRE_THROWS_QUINTET(TokenFile::open(junk), InvalidArgument,
                         "at byte 0: expected a token file");
  REQUIRE_THROWS_QUINTET(TokenFile::open(temp_dir() + "/missing.qts"), System, "cannot open");
}

TEST_CASE("bad llm.c shards are rejected at open") {
  const auto tokens = random_tokens(500, 50257, 8);
  const std::string good = temp_dir() + "/good_llmc.bin";
  write_llmc_shard(good, tokens.data(), 500);
  const auto bytes = read_all(good);
  const std::string bad = temp_dir() + "/bad_llmc.bin";
  {
    auto b = bytes;
    poke<std::int32_t>(b, 4, 2);
    write_all(bad, b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(bad), InvalidArgument,
                           "at byte 4: unsupported llm.c version for magic 20240520: expected 1, "
                           "found 2");
  }
  {
    auto b = bytes;
    b.resize(1024 + 600);
    write_all(bad, b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(bad), InvalidArgument,
                           "at byte 1624: payload truncated: expected 2024 bytes");
  }
  {
    auto b = bytes;
    poke<std::int32_t>(b, 8, 400);
    write_all(bad, b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(bad), InvalidArgument,
                           "at byte 1824: file size disagrees with the header: expected 1824 "
                           "bytes (1024 header bytes + 400 tokens of 2 bytes), found 2024");
  }
  {
    auto b = bytes;
    poke<std::int32_t>(b, 0, 20240521);
    write_all(bad, b);
    REQUIRE_THROWS_QUINTET(TokenFile::open_llmc(bad), InvalidArgument,
                           "at byte 0: wrong llm.c magic: expected 20240520");
  }
}

TEST_CASE("bad Megatron datasets are rejected at open") {
  const auto tokens = random_tokens(100, 30000, 9);
  const std::string prefix = temp_dir() + "/bad_mega";
  auto fresh = [&] { write_megatron_dataset(prefix, tokens.data(), 100, {0, 30, 100}); };
  fresh();
  const auto idx = read_all(prefix + ".idx");
  // Layout: 34 header bytes, sizes at 34 (2 x i32), pointers at 42 (2 x i64), doc index at 58.
  REQUIRE(idx.size() == 34 + 8 + 16 + 24);
  {
    auto b = idx;
    b[3] = 'X';
    write_all(prefix + ".idx", b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(prefix), InvalidArgument,
                           prefix + ".idx: at byte 0: wrong magic: expected \"MMIDIDX\\x00\\x00\"");
  }
  {
    auto b = idx;
    poke<std::uint64_t>(b, 9, 2);
    write_all(prefix + ".idx", b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(prefix), InvalidArgument,
                           "at byte 9: unsupported version: expected 1, found 2");
  }
  {
    auto b = idx;
    b[17] = 9;
    write_all(prefix + ".idx", b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(prefix), InvalidArgument,
                           "at byte 17: dtype code: expected 1..8");
  }
  {
    auto b = idx;
    poke<std::int64_t>(b, 42 + 8,
                       180);  // second sequence (70 tokens) at byte 180 of a 200-byte .bin
    write_all(prefix + ".idx", b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(prefix), InvalidArgument,
                           "at byte 50: sequence 1 points past the end of " + prefix +
                               ".bin: expected bytes [180, 320) within its 200 bytes");
  }
  {
    auto b = idx;
    b.resize(b.size() - 8);
    write_all(prefix + ".idx", b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(prefix), InvalidArgument,
                           "at byte 74: index truncated: expected 82 bytes");
  }
  {
    write_all(prefix + ".idx", idx);
    auto bin = read_all(prefix + ".bin");
    bin.resize(bin.size() + 2);
    write_all(prefix + ".bin", bin);
    REQUIRE_THROWS_QUINTET(TokenFile::open(prefix), InvalidArgument,
                           prefix + ".bin: at byte 200: file size disagrees with the index");
  }
  fresh();
  {
    auto b = idx;
    poke<std::int64_t>(b, 58 + 16, 1);  // last document index must be the sequence count 2
    write_all(prefix + ".idx", b);
    REQUIRE_THROWS_QUINTET(TokenFile::open(prefix), InvalidArgument,
                           "at byte 74: last document index: expected the sequence count 2, "
                           "found 1");
  }
}

TEST_CASE("a token that does not fit int32 is an error when read") {
  const std::vector<std::uint32_t> tokens = {1, 2, 3, 0x80000000u, 5};
  const std::string path = temp_dir() + "/big.qts";
  QuintetShardOptions opt;
  opt.token_type = TokenType::u32;
  write_quintet_shard(path, tokens.data(), 5, opt);
  const TokenFile f = TokenFile::open(path);
  std::vector<std::int32_t> out(5);
  f.read(0, 3, out.data());
  CHECK(out[2] == 3);
  REQUIRE_THROWS_QUINTET(f.read(0, 5, out.data()), InvalidArgument,
                         "token 3 of " + path + " is 2147483648");
  REQUIRE_THROWS_QUINTET(f.read(2, 4, out.data()), InvalidArgument, "which has 5 tokens");
  REQUIRE_THROWS_QUINTET(write_llmc_shard(path, tokens.data(), 5), InvalidArgument,
                         "does not fit u16");
}
