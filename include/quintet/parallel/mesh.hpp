// Mesh: this rank's place in a Layout, with one communicator per parallel axis.
//
// Built once per job by splitting the world communicator, then passed explicitly to whatever
// needs a group (there is no global mesh). Every axis gets its communicator from one
// world.split(color = index of this rank's group on the axis, key = its index in the group,
// members = the group's ranks), so comm(axis).rank() == rank(axis) and rank r of comm(axis) is
// group(axis)[r]; with the members, NCCL axes record into the flight recorder as '<axis> (nccl)'
// with their world ranks. A rank of a middle pipeline stage is in no embedding group and has no
// embedding communicator.
//
// Ownership: the Mesh owns its per-axis communicators; it does not keep the world communicator.
// Thread safety: the accessors are const and safe to share; using a communicator follows the
// Communicator contract (one issuing thread at a time per communicator).
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/parallel/layout.hpp"

namespace quintet {

class Mesh {
 public:
  // Collective over world: every rank of world constructs its Mesh with the same layout at the same
  // point (kNumAxes splits, in kAllAxes order). Throws InvalidArgument, before any communication,
  // when world.size() differs from layout.world().
  Mesh(Layout layout, Communicator& world);
  Mesh(Mesh&&) noexcept = default;
  Mesh& operator=(Mesh&&) noexcept = default;
  Mesh(const Mesh&) = delete;
  Mesh& operator=(const Mesh&) = delete;
  ~Mesh() = default;

  const Layout& layout() const { return layout_; }
  const ParallelConfig& config() const { return layout_.config(); }
  int global_rank() const { return rank_; }
  int world_size() const { return layout_.world(); }
  const Coordinates& coordinates() const { return coords_; }

  // Whether this rank belongs to a group of axis (false only for embedding on a middle stage).
  bool has(Axis axis) const { return comms_[static_cast<int>(axis)] != nullptr; }
  // This rank's index in its group on axis (== comm(axis).rank()), and that group's size.
  // Throw InvalidArgument when !has(axis).
  int rank(Axis axis) const;
  int size(Axis axis) const;
  // The global ranks of this rank's group on axis, in group order.
  const std::vector<int>& group(Axis axis) const;
  // The communicator of this rank's group on axis (owned by the Mesh).
  Communicator& comm(Axis axis) const;

  // Pipeline position: stage = rank(Axis::pp), 0 .. pp-1.
  int pp_stage() const { return coords_.pp; }
  int pp_size() const { return layout_.config().pp; }
  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const { return coords_.pp == layout_.config().pp - 1; }
  // Global ranks of the previous / next stage of this rank's pipeline, wrapping around (the last
  // stage's next is the first stage, as in Megatron-Core, which interleaved schedules use).
  int pp_prev_rank() const;
  int pp_next_rank() const;
  // The same neighbours as ranks of comm(Axis::pp), for send/recv on that communicator.
  int pp_prev_peer() const { return (coords_.pp + pp_size() - 1) % pp_size(); }
  int pp_next_peer() const { return (coords_.pp + 1) % pp_size(); }

 private:
  Layout layout_;
  int rank_ = 0;
  Coordinates coords_;
  std::array<std::unique_ptr<Communicator>, kNumAxes> comms_;
};

}  // namespace quintet
