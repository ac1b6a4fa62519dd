// Every rank of a communicator with the same configuration (see consistency.hpp).
#include "quintet/collectives/consistency.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {

std::uint64_t fnv1a(const std::string& s, std::uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Every rank's values of `mine`, gathered through comm's device (on its default stream).
std::vector<std::int64_t> gather(Communicator& comm, const std::vector<std::int64_t>& mine) {
  const Device& device = comm.device();
  const Stream s = device.is_cuda() ? Stream::default_stream(device) : Stream();
  const auto n = static_cast<std::int64_t>(mine.size());
  const Tensor in = Tensor::from_vector(mine, {n}).to(device, s);
  Tensor out = Tensor::empty({comm.size() * n}, DType::i64, device, s);
  comm.all_gather(in, out, s).wait(s);
  const Tensor host = out.to(Device::cpu(), s);
  s.synchronize();
  return host.to_vector<std::int64_t>();
}

}  // namespace

void check_same_on_all_ranks(Communicator& comm,
                             const std::vector<std::pair<std::string, std::string>>& fields,
                             const std::string& what) {
  const int ranks = comm.size();
  // One fixed-size record per rank: the field count, the hash of the names, the hash of each
  // value.
  constexpr std::size_t kFields = 254;
  QUINTET_CHECK(fields.size() <= kFields,
                "{}: check_same_on_all_ranks takes at most {} fields, got {}", what, kFields,
                fields.size());
  std::vector<std::int64_t> mine(kFields + 2, 0);
  mine[0] = static_cast<std::int64_t>(fields.size());
  std::uint64_t names = 1469598103934665603ull;
  for (std::size_t i = 0; i < fields.size(); ++i) {
    names = fnv1a(fields[i].first + '\n', names);
    mine[2 + i] = static_cast<std::int64_t>(fnv1a(fields[i].second));
  }
  mine[1] = static_cast<std::int64_t>(names);
  const std::vector<std::int64_t> all = gather(comm, mine);
  const auto at = [&](int r, std::size_t k) { return all[r * mine.size() + k]; };
  for (int r = 1; r < ranks; ++r) {
    QUINTET_CHECK(at(r, 0) == at(0, 0) && at(r, 1) == at(0, 1),
                  "{}: rank {} was started with another set of settings than rank 0 ({} against "
                  "{} fields, or other names); start every rank with the same program and flags",
                  what, r, at(r, 0), at(0, 0));
  }
  std::size_t differ = kFields;
  for (std::size_t k = 0; k < kFields && differ == kFields; ++k) {
    for (int r = 1; r < ranks; ++r) {
      if (at(r, 2 + k) != at(0, 2 + k)) differ = k;
    }
  }
  if (differ == kFields) return;
  // The differing field's value on every rank (the same field on all: the records agree on it).
  constexpr std::size_t kChars = 200;
  const std::size_t index = differ;  // < fields.size(): unused slots are 0 on every rank
  std::vector<std::int64_t> text((kChars + 7) / 8, 0);
  const std::string& value = fields[index].second;
  std::memcpy(text.data(), value.data(), std::min(value.size(), kChars));
  const std::vector<std::int64_t> values = gather(comm, text);
  std::string list;
  for (int r = 0; r < ranks; ++r) {
    const char* p = reinterpret_cast<const char*>(values.data() + r * text.size());
    list +=
        fmt::format("{}rank {}: \"{}\"", r == 0 ? "" : ", ", r, std::string(p, strnlen(p, kChars)));
  }
  QUINTET_THROW(InvalidArgument,
                "{}: the ranks were started with different values of {} ({}); start every "
                "rank with the same settings",
                what, fields[index].first, list);
}

}  // namespace quintet
