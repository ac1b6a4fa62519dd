// Private helpers shared by schedule.cpp, generators.cpp and simulator.cpp.
#pragma once

#include <optional>
#include <vector>

#include "quintet/parallel/pipeline/schedule.hpp"

namespace quintet::pipeline::detail {

// The structural half of Schedule::validate(): sizes, placement, each (stage, microbatch) computed
// once in the right order, on the right rank. Everything but the transfers, which simulate() models
// (an unmatched transfer is a deadlock there, not an error).
void validate_structure(const Schedule& schedule);

// The transfer on the peer that pairs with a send or receive: SF(s, m) <-> RF(s + 1, m) and
// SB(s, m) <-> RB(s - 1, m).
Action matching_transfer(const Action& transfer);

// The receive a compute action waits for, when its input comes from another rank: RF for F (not on
// stage 0), RB for B or I (not on the last stage); none for W or when the neighbour is on this
// rank.
std::optional<Action> input_receive(const Schedule& schedule, const Action& compute);

// The send a compute action's output needs, when it goes to another rank: SF after F, SB after B or
// I; none for W or when the neighbour is on this rank.
std::optional<Action> output_send(const Schedule& schedule, const Action& compute);

// SF or SB.
bool is_send(ActionKind kind);

// "the 3rd".
std::string ordinal(int index_from_zero);

}  // namespace quintet::pipeline::detail
