#include "quintet/collectives/communicator.hpp"

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

}  // namespace quintet
