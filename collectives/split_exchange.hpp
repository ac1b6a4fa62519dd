// SplitExchange: the members of a split that the backend cannot see (an NCCL split made without
// Communicator::split's members), gathered over MPI before any NCCL call, so that the split can
// record into the flight recorder with its members' world ranks (issue #44).
//
// Every rank of the parent sends its (color, key) to every other one over a duplicate of an MPI
// communicator of the parent's ranks in the same order (for quintet::init's NCCL world,
// MPI_COMM_WORLD), one MPI_Iallgather of two ints, polled until timeout_s. The Mesh names its
// members and needs none of this; quintet::init gives one to the NCCL world only (its splits'
// splits without members record nothing).
#pragma once

#include <mpi.h>

#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

namespace quintet::detail {

// The members of rank's group in a split where rank r passed color_key[r] = (color, key): the
// ranks of its color, ordered by key then rank (MPI_Comm_split's and ncclCommSplit's order); empty
// when its color is < 0.
std::vector<int> split_members(const std::vector<std::pair<int, int>>& color_key, int rank);

class SplitExchange {
 public:
  // Duplicates ranks (collective over it); the duplicate carries nothing else.
  explicit SplitExchange(MPI_Comm ranks);
  // Frees the duplicate unless MPI is finalized, or an exchange timed out on it. Never throws.
  ~SplitExchange();
  SplitExchange(const SplitExchange&) = delete;
  SplitExchange& operator=(const SplitExchange&) = delete;

  int size() const { return size_; }

  // Collective over the ranks: split_members of everyone's (color, key), for this rank. Throws
  // Timeout naming `what` when some rank has not taken part within timeout_s; the exchange is then
  // broken, and later calls throw Aborted.
  std::vector<int> members(int color, int key, double timeout_s, std::string_view what);

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 0;
  std::mutex mutex_;  // one exchange at a time
  bool broken_ = false;
};

}  // namespace quintet::detail
