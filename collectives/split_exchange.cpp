#include "collectives/split_exchange.hpp"

#include <algorithm>
#include <chrono>
#include <thread>

#include "quintet/core/error.hpp"

namespace quintet::detail {

std::vector<int> split_members(const std::vector<std::pair<int, int>>& color_key, int rank) {
  QUINTET_CHECK(rank >= 0 && static_cast<std::size_t>(rank) < color_key.size(),
                "split_members: rank {} of {}", rank, color_key.size());
  const int color = color_key[static_cast<std::size_t>(rank)].first;
  std::vector<int> members;
  if (color < 0) return members;
  for (int r = 0; r < static_cast<int>(color_key.size()); ++r) {
    if (color_key[static_cast<std::size_t>(r)].first == color) members.push_back(r);
  }
  std::stable_sort(members.begin(), members.end(), [&](int a, int b) {
    return color_key[static_cast<std::size_t>(a)].second <
           color_key[static_cast<std::size_t>(b)].second;
  });
  return members;
}

SplitExchange::SplitExchange(MPI_Comm ranks) {
  QUINTET_MPI_CHECK(MPI_Comm_dup(ranks, &comm_));
  QUINTET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  QUINTET_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  QUINTET_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

SplitExchange::~SplitExchange() {
  int finalized = 1;
  MPI_Finalized(&finalized);
  // After a timeout an exchange is still pending on the duplicate: leave it.
  if (!finalized && !broken_ && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

std::vector<int> SplitExchange::members(int color, int key, double timeout_s,
                                        std::string_view what) {
  std::lock_guard lock(mutex_);
  if (broken_) {
    QUINTET_THROW(Aborted,
                  "{}: the exchange of the split's members over MPI timed out before; the "
                  "communicator cannot be split without naming the members",
                  what);
  }
  const int mine[2] = {color, key};
  std::vector<int> all(2 * static_cast<std::size_t>(size_));
  MPI_Request request = MPI_REQUEST_NULL;
  QUINTET_MPI_CHECK(MPI_Iallgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, comm_, &request));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  for (int polls = 0;; ++polls) {
    int done = 0;
    QUINTET_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      broken_ = true;  // the gather stays pending: nothing may use the duplicate again
      QUINTET_THROW(Timeout,
                    "{}: the exchange of the split's members (colors and keys) over MPI did not "
                    "complete within {} s: some rank of the communicator did not call split "
                    "(every rank must, with color < 0 for no group)",
                    what, timeout_s);
    }
    if (polls < 100) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  std::vector<std::pair<int, int>> color_key(static_cast<std::size_t>(size_));
  for (std::size_t r = 0; r < color_key.size(); ++r) color_key[r] = {all[2 * r], all[2 * r + 1]};
  return split_members(color_key, rank_);
}

}  // namespace quintet::detail
