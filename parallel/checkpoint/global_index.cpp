// Pieces of global tensors: names, the index over every shard, and the box copy (see
// global_index.hpp).
#include "quintet/parallel/checkpoint/global_index.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "quintet/core/error.hpp"

namespace quintet::checkpoint {

namespace {

std::string dims(const Shape& s) { return s.empty() ? "-" : fmt::format("{}", fmt::join(s, ",")); }

std::optional<Shape> parse_dims(const std::string& text) {
  Shape out;
  if (text == "-") return out;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    const std::string d = text.substr(begin, end - begin);
    if (d.empty() || d.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
    out.push_back(std::stoll(d));
    begin = end + 1;
  }
  return out;
}

// Copies the intersection of the src box into the dst box (both row-major on the host, elements
// of `size` bytes); returns the elements copied.
std::int64_t copy_box(const char* src, const Shape& src_start, const Shape& src_shape, char* dst,
                      const Shape& dst_start, const Shape& dst_shape, std::size_t size) {
  const std::size_t n = dst_shape.size();
  if (n == 0) {
    std::memcpy(dst, src, size);
    return 1;
  }
  Shape lo(n), hi(n);
  for (std::size_t d = 0; d < n; ++d) {
    lo[d] = std::max(src_start[d], dst_start[d]);
    hi[d] = std::min(src_start[d] + src_shape[d], dst_start[d] + dst_shape[d]);
    if (hi[d] <= lo[d]) return 0;
  }
  const std::size_t run = static_cast<std::size_t>(hi[n - 1] - lo[n - 1]) * size;
  Shape at = lo;  // the global index of the run's first element
  std::int64_t copied = 0;
  for (;;) {
    std::int64_t s = 0, t = 0;
    for (std::size_t d = 0; d < n; ++d) {
      s = s * src_shape[d] + (at[d] - src_start[d]);
      t = t * dst_shape[d] + (at[d] - dst_start[d]);
    }
    std::memcpy(dst + static_cast<std::size_t>(t) * size, src + static_cast<std::size_t>(s) * size,
                run);
    copied += hi[n - 1] - lo[n - 1];
    std::size_t d = n - 1;  // advance the leading dimensions (the last one is the run)
    for (;;) {
      if (d == 0) return copied;
      --d;
      if (++at[d] < hi[d]) break;
      at[d] = lo[d];
    }
  }
}

}  // namespace

std::string encode_piece_name(const PieceName& p) {
  return fmt::format("{}/{}@{}@{}", p.field, p.name, dims(p.start), dims(p.global_shape));
}

std::optional<PieceName> decode_piece_name(const std::string& text) {
  const std::size_t slash = text.find('/');
  const std::size_t at2 = text.rfind('@');
  if (slash == std::string::npos || at2 == std::string::npos || at2 == 0) return std::nullopt;
  const std::size_t at1 = text.rfind('@', at2 - 1);
  if (at1 == std::string::npos || at1 <= slash) return std::nullopt;
  PieceName p;
  p.field = text.substr(0, slash);
  p.name = text.substr(slash + 1, at1 - slash - 1);
  const auto start = parse_dims(text.substr(at1 + 1, at2 - at1 - 1));
  const auto global = parse_dims(text.substr(at2 + 1));
  if (!start || !global || start->size() != global->size() || p.field.empty() || p.name.empty())
    return std::nullopt;
  p.start = *start;
  p.global_shape = *global;
  return p;
}

GlobalIndex::GlobalIndex(const CheckpointInfo& checkpoint) : checkpoint_(checkpoint) {
  for (int r = 0; r < checkpoint.world_size; ++r) {
    shards_.push_back(read_shard_index(checkpoint, r));
    for (const ShardEntry& e : shards_.back().entries) {
      std::optional<PieceName> id = decode_piece_name(e.name);
      if (!id) continue;  // a tensor of the caller's own (not a piece)
      auto& list = pieces_[{id->field, id->name}];
      list.push_back(Piece{std::move(*id), r, e});
    }
  }
}

const std::vector<GlobalIndex::Piece>* GlobalIndex::find(const std::string& field,
                                                         const std::string& name) const {
  const auto it = pieces_.find({field, name});
  return it == pieces_.end() ? nullptr : &it->second;
}

std::vector<GlobalIndex::Summary> GlobalIndex::summary() const {
  std::vector<Summary> out;
  for (const auto& [key, list] : pieces_) {
    Summary s;
    s.field = key.first;
    s.name = key.second;
    s.global_shape = list.front().id.global_shape;
    s.dtype = list.front().entry.dtype;
    for (const Piece& p : list) {
      ++s.pieces;
      s.covered += shape_numel(p.entry.shape);
    }
    out.push_back(std::move(s));
  }
  return out;
}

void GlobalIndex::assemble(const std::string& field, const std::string& name,
                           const Shape& global_shape, const Shape& start, const Tensor& target,
                           const Stream& stream) const {
  const std::vector<Piece>* list = find(field, name);
  QUINTET_CHECK(list != nullptr, "checkpoint {}: no {} of {} was saved", checkpoint_.path, field,
                name);
  const Shape& shape = target.shape();
  QUINTET_CHECK(start.size() == shape.size() && global_shape.size() == shape.size(),
                "GlobalIndex::assemble: {} {}: start {} and global shape {} for a box of {}", field,
                name, shape_str(start), shape_str(global_shape), shape_str(shape));
  Tensor host = Tensor::empty(shape, target.dtype(), Device::cpu());
  std::int64_t covered = 0;
  for (const Piece& p : *list) {
    QUINTET_CHECK(p.id.global_shape == global_shape && p.entry.dtype == target.dtype(),
                  "checkpoint {}: {} of {} was saved as a {} {} tensor, this model has {} {}",
                  checkpoint_.path, field, name, dtype_name(p.entry.dtype),
                  shape_str(p.id.global_shape), dtype_name(target.dtype()),
                  shape_str(global_shape));
    bool meets = true;  // does the piece intersect the box?
    for (std::size_t d = 0; d < shape.size(); ++d) {
      meets = meets && p.id.start[d] < start[d] + shape[d] &&
              start[d] < p.id.start[d] + p.entry.shape[d];
    }
    if (!meets || shape_numel(shape) == 0) continue;
    const Tensor piece =
        read_shard_tensor(checkpoint_, p.rank, shards_[static_cast<std::size_t>(p.rank)], p.entry);
    covered +=
        copy_box(static_cast<const char*>(piece.data_ptr()), p.id.start, p.entry.shape,
                 static_cast<char*>(host.data_ptr()), start, shape, dtype_size(target.dtype()));
  }
  QUINTET_CHECK(covered == shape_numel(shape),
                "checkpoint {}: the saved pieces of {} of {} cover {} of the {} elements of the "
                "box at {} of shape {}{}",
                checkpoint_.path, field, name, covered, shape_numel(shape), shape_str(start),
                shape_str(shape), covered > shape_numel(shape) ? " (pieces overlap)" : "");
  Tensor dst = target;
  dst.copy_(host, stream);
  if (dst.device().is_cuda()) stream.synchronize();
}

}  // namespace quintet::checkpoint
