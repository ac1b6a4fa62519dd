// Axis: the rank groups of the 5-D layout (docs/architecture.md §4), one enum shared by the layout
// (quintet/parallel/layout.hpp computes each axis's groups), the mesh (one communicator per axis)
// and the parameters (nn::ParameterAttributes::shard_axis names the axis a weight is split over).
// Header-only.
#pragma once

#include <array>

namespace quintet {

// The rank groups a Layout provides. Single-dimension axes first, then combined ones.
enum class Axis {
  tp,         // tensor parallel (dense layers)
  cp,         // context parallel
  ep,         // expert parallel
  dp,         // data parallel of dense layers, without cp
  pp,         // pipeline: the stages of one pipeline, first stage first
  etp,        // expert tensor parallel
  edp,        // expert data parallel
  tp_cp,      // "tp-cp": tensor x context
  dp_cp,      // "dp-cp": data x context (where dense gradients are reduced when cp > 1)
  tp_dp_cp,   // "tp-dp-cp": everything but pp
  mp,         // model parallel: "tp-pp"
  etp_ep,     // "etp-ep": expert tensor x expert parallel (token dispatch with etp > 1)
  embedding,  // first and last stage of each pipeline (the rank alone when pp == 1); ranks of
              // middle stages are in no embedding group
};
inline constexpr int kNumAxes = 13;
inline constexpr std::array<Axis, kNumAxes> kAllAxes = {
    Axis::tp,    Axis::cp,    Axis::ep,       Axis::dp, Axis::pp,     Axis::etp,      Axis::edp,
    Axis::tp_cp, Axis::dp_cp, Axis::tp_dp_cp, Axis::mp, Axis::etp_ep, Axis::embedding};

}  // namespace quintet
