#include "quintet/collectives/communicator.hpp"

#include <fmt/ranges.h>

#include <algorithm>

#include "quintet/core/error.hpp"

namespace quintet {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::max:
      return "max";
    case ReduceOp::min:
      return "min";
    case ReduceOp::prod:
      return "prod";
  }
  return "unknown";
}

std::string_view backend_name(Backend b) {
  switch (b) {
    case Backend::mpi:
      return "mpi";
    case Backend::nccl:
      return "nccl";
    case Backend::self:
      return "self";
  }
  return "unknown";
}

std::unique_ptr<Communicator> Communicator::split(int color, int key, const std::string& name,
                                                  const std::vector<int>& members) {
  const std::string what =
      fmt::format("split of communicator '{}' into '{}' (color {}, key {}, members [{}])",
                  this->name(), name, color, key, fmt::join(members, ", "));
  if (color < 0) {
    QUINTET_CHECK(members.empty(),
                  "{}: this rank is in no group (color < 0) but members are given; pass none",
                  what);
  } else {
    QUINTET_CHECK(!members.empty(),
                  "{}: no members given; give the ranks of '{}' whose color is {}, in key order, "
                  "this rank ({}) among them",
                  what, this->name(), color, rank());
    for (const int m : members) {
      QUINTET_CHECK(m >= 0 && m < size(), "{}: member {} is not a rank of '{}' (0..{})", what, m,
                    this->name(), size() - 1);
    }
    std::vector<int> sorted = members;
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    QUINTET_CHECK(twice == sorted.end(), "{}: rank {} is a member twice", what,
                  twice == sorted.end() ? -1 : *twice);
    QUINTET_CHECK(std::find(members.begin(), members.end(), rank()) != members.end(),
                  "{}: this rank ({}) is not among the members", what, rank());
  }
  std::unique_ptr<Communicator> child = split_with_members(color, key, name, members);
  if (color >= 0) {
    const auto expected =
        static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    QUINTET_CHECK(child != nullptr && child->size() == static_cast<int>(members.size()) &&
                      child->rank() == expected,
                  "{}: the split gave rank {} of {} but the members make this rank {} of {}: "
                  "other ranks of the group passed other colors or keys, or members are not in "
                  "key order",
                  what, child ? child->rank() : -1, child ? child->size() : 0, expected,
                  members.size());
  }
  return child;
}

std::unique_ptr<Communicator> Communicator::split_with_members(int color, int key,
                                                               const std::string& name,
                                                               const std::vector<int>&) {
  return split(color, key, name);
}

}  // namespace quintet
