// Pieces of global tensors: how a checkpoint that loads at any layout names what each rank saved,
// and how a rank of another layout assembles its part from them (global_index.cpp).
//
// A piece is the box [start, start + shape) of a global tensor of global_shape, under a field
// ("value", "master", "exp_avg", "exp_avg_sq", or any other the caller uses). In a shard
// (checkpoint.hpp) it is the tensor named "field/name@s0,s1,...@g0,g1,..." (a scalar: "@-@-"):
// its start and the global shape ride in the name, its own shape and dtype in the header.
// GlobalIndex reads every shard's header (not the payloads) of a checkpoint, and assemble() reads
// only the pieces that intersect the box asked for, each verified by its own checksum.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "quintet/core/tensor.hpp"
#include "quintet/parallel/checkpoint/checkpoint.hpp"

namespace quintet::checkpoint {

struct PieceName {
  std::string field;
  std::string name;
  Shape start;         // where the piece begins in the global tensor
  Shape global_shape;  // the whole tensor's shape
};
std::string encode_piece_name(const PieceName& piece);
// nullopt for a name that is not a piece's.
std::optional<PieceName> decode_piece_name(const std::string& text);

class GlobalIndex {
 public:
  struct Piece {
    PieceName id;
    int rank = 0;      // the shard that holds it
    ShardEntry entry;  // its header entry there (dtype, shape, bytes, checksum)
  };
  // What one global tensor has in the checkpoint.
  struct Summary {
    std::string field, name;
    Shape global_shape;
    DType dtype = DType::f32;
    int pieces = 0;
    std::int64_t covered = 0;  // elements in its pieces
  };

  // Reads the header of every shard of checkpoint (System for a missing or corrupt one).
  explicit GlobalIndex(const CheckpointInfo& checkpoint);

  // The pieces of (field, name), in rank order; null when there is none.
  const std::vector<Piece>* find(const std::string& field, const std::string& name) const;
  // Every global tensor, ordered by (field, name).
  std::vector<Summary> summary() const;
  // Whether the checkpoint holds no piece at all (one saved in another format).
  bool empty() const { return pieces_.empty(); }
  // Whether (field, name) was saved.
  bool has(const std::string& field, const std::string& name) const {
    return find(field, name) != nullptr;
  }

  // Fills target, the box [start, start + target.shape()) of global tensor (field, name) of
  // global_shape, from the pieces that intersect it (read from disk, checksums verified), on
  // stream for a GPU target. Throws InvalidArgument, naming the tensor, when it was not saved,
  // was saved with another global shape or dtype, or a part of the box is in no piece.
  void assemble(const std::string& field, const std::string& name, const Shape& global_shape,
                const Shape& start, const Tensor& target, const Stream& stream) const;

  const CheckpointInfo& checkpoint() const { return checkpoint_; }

 private:
  CheckpointInfo checkpoint_;
  std::vector<ShardIndex> shards_;  // by rank
  std::map<std::pair<std::string, std::string>, std::vector<Piece>> pieces_;
};

}  // namespace quintet::checkpoint
