#include "quintet/parallel/mesh.hpp"

#include <string>
#include <vector>

#include "quintet/core/error.hpp"

namespace quintet {

Mesh::Mesh(Layout layout, Communicator& world) : layout_(std::move(layout)) {
  QUINTET_CHECK(world.size() == layout_.world(),
                "the layout is for {} ranks but communicator '{}' has {}: build the Layout with "
                "world = {}",
                layout_.world(), world.name(), world.size(), world.size());
  rank_ = world.rank();
  coords_ = layout_.coordinates(rank_);
  for (Axis axis : kAllAxes) {
    const int color = layout_.group_index(axis, rank_);
    const int key = layout_.index_in_group(axis, rank_);
    // The group's ranks: split checks that the backend ordered them by key (one that did not
    // would silently mis-wire every group), and NCCL records the axis's operations in the flight
    // recorder with their world ranks.
    static const std::vector<int> kNoGroup;
    const std::vector<int>& members = color >= 0 ? layout_.group_of(axis, rank_) : kNoGroup;
    comms_[static_cast<int>(axis)] = world.split(color, key, std::string(axis_name(axis)), members);
  }
}

Communicator& Mesh::comm(Axis axis) const {
  const auto& comm = comms_[static_cast<int>(axis)];
  QUINTET_CHECK(comm != nullptr,
                "rank {} (pipeline stage {} of {}) is in no '{}' group: check Mesh::has first",
                rank_, coords_.pp, layout_.config().pp, axis_name(axis));
  return *comm;
}

int Mesh::rank(Axis axis) const { return comm(axis).rank(); }

int Mesh::size(Axis axis) const { return comm(axis).size(); }

const std::vector<int>& Mesh::group(Axis axis) const { return layout_.group_of(axis, rank_); }

int Mesh::pp_prev_rank() const { return group(Axis::pp)[pp_prev_peer()]; }

int Mesh::pp_next_rank() const { return group(Axis::pp)[pp_next_peer()]; }

}  // namespace quintet
