// ModelGroups: the communicators a model chunk's layers use (borrowed; they must outlive the
// model). Header-only. The tensor-parallel group, and the context- and expert-parallel groups
// of the slots that use them.
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
  // Expert parallel and expert tensor parallel (MoE blocks; optional: null for one rank): the
  // experts are spread over ep and each split over etp (expert/moe_layer.hpp).
  Communicator* ep = nullptr;
  Communicator* etp = nullptr;
  // Every rank of the pipeline stage (Axis::tp_dp_cp): the MoE experts' FP8 amaxes are reduced
  // over it (expert/experts.hpp). Required for MoE blocks with fp8, unused otherwise.
  Communicator* stage = nullptr;

  // The groups of this rank in mesh.
  static ModelGroups of(Mesh& mesh) {
    return ModelGroups{&mesh.comm(Axis::tp), &mesh.comm(Axis::cp), &mesh.comm(Axis::ep),
                       &mesh.comm(Axis::etp), &mesh.comm(Axis::tp_dp_cp)};
  }
  int cp_size() const { return cp != nullptr ? cp->size() : 1; }
  int ep_size() const { return ep != nullptr ? ep->size() : 1; }
  int etp_size() const { return etp != nullptr ? etp->size() : 1; }
};

}  // namespace quintet::model
