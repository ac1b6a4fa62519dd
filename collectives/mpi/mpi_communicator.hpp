// MpiCommunicator: the Communicator over an MPI communicator, for CPU tensors.
//
// Every operation is validated on the calling thread, then queued to the communicator's progress
// thread, which runs the blocking MPI calls in order (the same algorithms as a raw MPI call).
// Counts above MpiOptions::max_chunk_elements are split into several calls.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>

#include "collectives/mpi/progress_thread.hpp"
#include "quintet/collectives/mpi.hpp"

namespace quintet::detail {

class MpiCommunicator final : public Communicator {
 public:
  // Takes ownership of comm (a communicator this process made: freed on destruction).
  MpiCommunicator(MPI_Comm comm, std::string name, const MpiOptions& options);
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::mpi; }
  Device device() const override { return Device::cpu(); }
  const std::string& name() const override { return name_; }

  using Communicator::all_reduce;
  Work all_reduce(const Tensor& in, const Tensor& out, ReduceOp op, const Stream& s) override;
  Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, const Stream& s) override;
  Work all_gather(const Tensor& in, const Tensor& out, const Stream& s) override;
  Work broadcast(const Tensor& inout, int root, const Stream& s) override;
  Work reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root, const Stream& s) override;
  Work all_to_all(const Tensor& in, const Tensor& out, const Stream& s) override;
  Work all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                    const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                    const Stream& s) override;
  Work send(const Tensor& in, int peer, const Stream& s) override;
  Work recv(const Tensor& out, int peer, const Stream& s) override;
  Work p2p(const std::vector<P2POp>& ops, const Stream& s) override;
  Work barrier(const Stream& s) override;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  // How many of this communicator's operations its progress thread has begun running itself
  // (not a caller that waited for them): tests/mpi/collectives_failure_test.cpp waits for it.
  std::uint64_t started_by_thread() const { return thread_.started_by_thread(); }

 private:
  // "all_reduce #3 (10 x f32) on communicator 'dp' (mpi, 4 ranks)"
  std::string describe(std::string_view op, std::uint64_t seq, const Tensor* t) const;
  // Queues the next operation (op: a static name; peer: peer or root, -1 for none) and notes it
  // in the flight recorder.
  Work enqueue(const char* op, const Tensor* t, int peer, std::function<void()> fn);

  // Bodies run on the progress thread.
  void run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) const;
  void run_all_gather(const Tensor& in, const Tensor& out) const;
  // Exchanges counts[j] elements with every rank through nonblocking sends and receives (the
  // path for counts or offsets that do not fit MPI's int).
  void exchange(const char* in, const std::vector<std::int64_t>& send_counts, char* out,
                const std::vector<std::int64_t>& recv_counts, DType dtype) const;

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  MpiOptions options_;
  std::uint64_t sequence_ = 0;
  std::shared_ptr<FlightRecorder> flight_;
  ProgressThread thread_;
};

}  // namespace quintet::detail
