// ModelGroups: the communicators a model chunk's layers use (borrowed; they must outlive the
// model). Header-only. Today the tensor-parallel group; the context- and expert-parallel groups
// join it as their slots land.
#pragma once

#include "quintet/collectives/communicator.hpp"
#include "quintet/parallel/mesh.hpp"

namespace quintet::model {

struct ModelGroups {
  // Tensor parallel: heads, the MLP width and the vocabulary are split over it (a one-rank
  // communicator for no tensor parallelism). Required.
  Communicator* tp = nullptr;
  // Context parallel: each rank holds 2 chunks of every sequence, attention spans the group
  // (optional: null for no context parallelism).
  Communicator* cp = nullptr;

  // The groups of this rank in mesh.
  static ModelGroups of(Mesh& mesh) {
    return ModelGroups{&mesh.comm(Axis::tp), &mesh.comm(Axis::cp)};
  }
  int cp_size() const { return cp != nullptr ? cp->size() : 1; }
};

}  // namespace quintet::model
