// Layout: which global ranks form each parallel group of a 5-D parallel job (tensor, context,
// expert, data and pipeline parallelism), placed exactly as Megatron-Core places them.
//
// A Layout is a pure value computed from a ParallelConfig and the world size: no process,
// communicator or device is involved, so any placement can be inspected and tested offline
// (examples/02_layout prints them). Mesh (mesh.hpp) turns a Layout into communicators.
//
// Placement. The order string ("tp-cp-ep-dp-pp" by default) lists the five dimensions with the
// first varying fastest: in the default order the rank at coordinates (t, c, e, d, p) is
// t + tp*(c + cp*(e + ep*(d + dp*p))), so tensor-parallel ranks are neighbours (one node). Dense
// layers use the sizes (tp, cp, dp, pp) with ep folded out (size 1); expert layers see the same
// ranks as (etp, ep, edp, pp) with cp folded out, where edp = world / (etp*ep*pp). This is
// Megatron-Core's RankGenerator used twice (decoder and expert generators of
// initialize_model_parallel), so a job moved from Megatron keeps its ranks.
//
// Thread safety: a Layout is immutable after construction; share it freely.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/core/axis.hpp"

namespace quintet {

// The sizes of the parallel dimensions. A size is a number of ranks.
struct ParallelConfig {
  static constexpr std::string_view kDefaultOrder = "tp-cp-ep-dp-pp";

  int tp = 1;   // tensor parallel: ranks that split each layer's weight matrices
  int cp = 1;   // context parallel: ranks that split the sequence
  int ep = 1;   // expert parallel: ranks that hold different experts of an MoE layer
  int etp = 0;  // expert tensor parallel: ranks that split each expert; 0 means "same as tp"
  int dp = 0;   // data parallel (dense layers); 0 means "world / (tp*cp*pp)"
  int pp = 1;   // pipeline parallel: number of stages
  // Virtual pipeline stages: model chunks held by each rank (interleaved schedules). 1 = plain
  // pipeline. vpp > 1 needs pp > 1: with one stage there is nothing to interleave. Whether the
  // model's layers divide into pp*vpp chunks is checked by the pipeline, which knows the model.
  int vpp = 1;
  // The names tp, cp, ep, dp, pp joined by '-', the first varying fastest. As in Megatron-Core, a
  // dimension of size 1 may be left out: it is appended after the named ones, in the order tp, pp,
  // dp, ep, cp (so "tp-dp-pp" with cp = ep = 1 is "tp-dp-pp-ep-cp"). Case-insensitive.
  std::string order = std::string(kDefaultOrder);

  // Throws InvalidArgument, naming the field and how to fix it, unless this config fits `world`
  // ranks: every size >= 1 (etp, dp may be 0 = derived), vpp >= 1 and vpp > 1 only with pp > 1,
  // tp*cp*pp divides world (and equals world / dp when dp is given), etp*ep*pp divides world, the
  // order names each dimension at most once and leaves out only dimensions of size 1 in dense and
  // expert layers (tp and etp, dp and edp), and dense and expert layers get the same pipeline
  // groups (Megatron-Core asserts this too; it always holds with pp last or first in the order).
  void validate(int world) const;
  // A validated copy with etp and dp filled in (never 0) and the order written out in full, in
  // lower case, with the dimensions it left out appended.
  ParallelConfig resolved(int world) const;
  // The expert data-parallel size world / (etp*ep*pp) of a validated config.
  int edp(int world) const;
};

// "tp", "tp-cp", "dp-cp", "tp-dp-cp", "mp", "etp-ep", "embedding", ...
std::string_view axis_name(Axis axis);

// A rank's index in its group on each single axis (its "tp rank", "pp stage", ...).
struct Coordinates {
  int tp = 0, cp = 0, ep = 0, dp = 0, pp = 0, etp = 0, edp = 0;
};

class Layout {
 public:
  // Validates config for world ranks (throws InvalidArgument) and computes every group.
  Layout(const ParallelConfig& config, int world);

  // The resolved config (etp and dp filled in).
  const ParallelConfig& config() const { return config_; }
  int world() const { return world_; }

  // All groups of an axis, each a list of global ranks in group order (index in the list = rank
  // in the group's communicator), groups in Megatron-Core's order.
  const std::vector<std::vector<int>>& groups(Axis axis) const;
  // Ranks per group on axis (for embedding: 1 when pp == 1, else 2).
  int group_size(Axis axis) const;
  // Whether rank belongs to a group of axis (false only for middle stages on embedding).
  bool contains(Axis axis, int rank) const;
  // Which group of axis holds rank (an index into groups(axis)), or -1 when none does.
  int group_index(Axis axis, int rank) const;
  // rank's position in its group on axis, or -1 when it is in none.
  int index_in_group(Axis axis, int rank) const;
  // The group of axis that holds rank; throws InvalidArgument when none does.
  const std::vector<int>& group_of(Axis axis, int rank) const;

  // rank's index on each single axis.
  Coordinates coordinates(int rank) const;
  // The rank at dense coordinates (tp, cp, dp, pp fields) / expert coordinates (etp, ep, edp, pp
  // fields); the other fields are ignored. Throws InvalidArgument for an out-of-range coordinate.
  int dense_rank(const Coordinates& c) const;
  int expert_rank(const Coordinates& c) const;

 private:
  void check_rank(int rank) const;

  ParallelConfig config_;
  int world_ = 0;
  std::array<int, 5> order_{};         // position in the order string -> dimension (tp..pp)
  std::array<int, 5> dense_sizes_{};   // by position
  std::array<int, 5> expert_sizes_{};  // by position
  std::array<std::vector<std::vector<int>>, kNumAxes> groups_;
  std::array<std::vector<int>, kNumAxes> group_index_;     // [axis][rank]
  std::array<std::vector<int>, kNumAxes> index_in_group_;  // [axis][rank]
};

// Megatron-Core's generate_masked_orthogonal_rank_groups: the world is a grid of `sizes` (first
// varies fastest, product = world); returns the groups of ranks that vary only along the
// dimensions where mask is true, in group order (see layout.cpp for a worked example). Throws
// InvalidArgument when the sizes do not multiply to world or mask has another length.
std::vector<std::vector<int>> orthogonal_rank_groups(int world, const std::vector<int>& sizes,
                                                     const std::vector<bool>& mask);

}  // namespace quintet
