#include "naive_reader.hpp"

#include <cerrno>
#include <cstring>

#include "quintet/core/error.hpp"

using namespace quintet::data;

NaiveReader::NaiveReader(const Windows& windows) : windows_(windows) {
  for (const TokenFile& f : windows.dataset().files()) {
    std::FILE* fp = std::fopen(f.data_path().c_str(), "rb");
    if (fp == nullptr) {
      QUINTET_THROW(System, "cannot open {}: {}", f.data_path(), std::strerror(errno));
    }
    files_.push_back(fp);
  }
}

NaiveReader::~NaiveReader() {
  for (std::FILE* fp : files_) std::fclose(fp);
}

void NaiveReader::read_batch(const std::vector<SampleRef>& samples, std::int32_t* tokens,
                             std::int32_t* targets) {
  const std::int64_t T = windows_.seq_len();
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const Windows::Location loc = windows_.locate(samples[i].window);
    const TokenFile& f = windows_.dataset().files()[static_cast<std::size_t>(loc.file)];
    const std::size_t width = token_type_size(f.token_type());
    buffer_.resize(static_cast<std::size_t>(T + 1) * width);
    std::FILE* fp = files_[static_cast<std::size_t>(loc.file)];
    const auto offset =
        static_cast<long>(f.data_offset() + static_cast<std::uint64_t>(loc.start) * width);
    if (std::fseek(fp, offset, SEEK_SET) != 0 ||
        std::fread(buffer_.data(), 1, buffer_.size(), fp) != buffer_.size()) {
      QUINTET_THROW(System, "reading {} bytes at {} of {} failed", buffer_.size(), offset,
                    f.data_path());
    }
    std::int32_t* tok = tokens + i * T;
    std::int32_t* tgt = targets + i * T;
    auto convert = [&](auto tag) {
      using V = decltype(tag);
      for (std::int64_t j = 0; j <= T; ++j) {
        V v;
        std::memcpy(&v, buffer_.data() + j * sizeof(V), sizeof(V));
        const auto t = static_cast<std::int32_t>(v);
        if (j < T) tok[j] = t;
        if (j > 0) tgt[j - 1] = t;
      }
    };
    switch (f.token_type()) {
      case TokenType::u8:
        convert(std::uint8_t{});
        break;
      case TokenType::i8:
        convert(std::int8_t{});
        break;
      case TokenType::i16:
        convert(std::int16_t{});
        break;
      case TokenType::u16:
        convert(std::uint16_t{});
        break;
      case TokenType::i32:
        convert(std::int32_t{});
        break;
      case TokenType::u32:
        convert(std::uint32_t{});
        break;
      case TokenType::i64:
        convert(std::int64_t{});
        break;
      case TokenType::f32:
        convert(float{});
        break;
      case TokenType::f64:
        convert(double{});
        break;
    }
  }
}
