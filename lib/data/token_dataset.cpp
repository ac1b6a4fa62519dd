#include "quintet/data/token_dataset.hpp"

#include <glob.h>

#include <algorithm>
#include <set>

#include "quintet/core/error.hpp"

namespace quintet::data {

namespace {

bool has_glob_chars(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> expand(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> split_commas(const std::string& spec) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= spec.size()) {
    const std::size_t comma = spec.find(',', start);
    const std::size_t end = comma == std::string::npos ? spec.size() : comma;
    if (end > start) out.push_back(spec.substr(start, end - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

}  // namespace

TokenDataset::TokenDataset(std::vector<TokenFile> files) : files_(std::move(files)) {
  for (const TokenFile& f : files_) {
    QUINTET_CHECK(f.is_open(), "TokenDataset: a file handle was not opened");
  }
}

TokenDataset TokenDataset::open(const std::string& spec, const TokenFileOptions& options) {
  const std::vector<std::string> entries = split_commas(spec);
  QUINTET_CHECK(!entries.empty(), "TokenDataset::open: empty data spec; pass a path or a glob");
  std::vector<TokenFile> files;
  std::set<std::string> megatron_seen;
  for (const std::string& entry : entries) {
    std::vector<std::string> paths;
    if (has_glob_chars(entry)) {
      paths = expand(entry);
      QUINTET_CHECK(!paths.empty(), "data spec '{}' matches no file", entry);
    } else {
      paths = {entry};
    }
    for (const std::string& p : paths) {
      TokenFile f = TokenFile::open(p, options);
      if (f.format() == TokenFormat::megatron && !megatron_seen.insert(f.path()).second) continue;
      files.push_back(std::move(f));
    }
  }
  return TokenDataset(std::move(files));
}

std::int64_t TokenDataset::num_tokens() const {
  std::int64_t n = 0;
  for (const TokenFile& f : files_) n += f.num_tokens();
  return n;
}

Windows::Windows(TokenDataset dataset, std::int64_t seq_len)
    : dataset_(std::move(dataset)), seq_len_(seq_len) {
  QUINTET_CHECK(seq_len >= 1, "Windows: sequence length {} must be >= 1", seq_len);
  first_.push_back(0);
  for (const TokenFile& f : dataset_.files()) {
    const std::int64_t n = f.num_tokens();
    const std::uint64_t w = n > seq_len ? static_cast<std::uint64_t>((n - 1) / seq_len) : 0;
    first_.push_back(first_.back() + w);
  }
  QUINTET_CHECK(first_.back() > 0,
                "no window of {} + 1 tokens fits the dataset ({} files, {} tokens; the largest "
                "file must hold at least {} tokens): use a shorter --seq-len or more data",
                seq_len, dataset_.files().size(), dataset_.num_tokens(), seq_len + 1);
}

Windows::Location Windows::locate(std::uint64_t window) const {
  QUINTET_CHECK(window < count(), "window {} out of range: the dataset has {} windows", window,
                count());
  // The last file whose first window is <= window.
  const auto it = std::upper_bound(first_.begin(), first_.end(), window) - 1;
  Location loc;
  loc.file = static_cast<int>(it - first_.begin());
  loc.start = static_cast<std::int64_t>(window - *it) * seq_len_;
  return loc;
}

void Windows::read(std::uint64_t window, std::int32_t* tokens, std::int32_t* targets) const {
  const Location loc = locate(window);
  const TokenFile& f = dataset_.files()[static_cast<std::size_t>(loc.file)];
  f.read(loc.start, seq_len_, tokens);
  f.read(loc.start + 1, seq_len_, targets);
}

}  // namespace quintet::data
