// NcclCommunicator: the Communicator of CUDA tensors, over one NCCL communicator (private).
//
// Each communicator owns a high-priority comm stream and two NCCL comms of the same ranks (see
// NcclState): a blocking one for the operations, a non-blocking one for bounded splits. An
// operation records an event on the caller's stream and makes the comm stream wait on it (so the
// inputs are read after the work queued before the call, and compute on the caller's stream
// overlaps the communication), runs the NCCL call on the comm stream, and records a completion
// event there, held by the returned Work. Operations issued on one communicator run in issue order
// on its comm stream.
//
// The hot path allocates nothing on the GPU (but for the staging copy of an in-place all-to-all),
// never synchronises the host and never calls cudaSetDevice unless the calling thread's current
// device is another GPU; its host cost is two event records, one stream wait, the NCCL call and one
// small heap allocation (the Work). Not thread-safe, like every Communicator.
//
// Watchdog: each communicator's Watchdog (collectives/watchdog.hpp) holds its Works until the host
// sees them complete. An operation still not complete timeout_s after it was issued, while no
// thread waits for any Work of the communicator (a wait has its own deadline and throws a Timeout
// the program can catch), is a hang nobody would notice: the watchdog prints an error naming the
// operation, the communicator and (under mpirun, NcclOptions::progress) the rank that is behind,
// dumps the flight recorder, aborts the NCCL comm and ends the process (NcclState::expired;
// NcclOptions::end_process, which ends the whole job under mpirun). A wait's Timeout names that
// rank too.
// With a flight recorder (NcclOptions::world_ranks), each operation is recorded when it is issued
// and completed when the host sees it complete (the watchdog polls at a tenth of the timeout).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/nccl/nccl_state.hpp"
#include "quintet/collectives/communicator.hpp"

namespace quintet::detail {

class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::shared_ptr<NcclState> state);
  // Finalizes the NCCL comm (ncclCommAbort if that fails or times out); never throws. Its waits
  // are bounded by the timeout: if the comm stream is still busy after that (held back by a
  // caller's stream), the tensors of the unfinished operations are leaked, never reused. NCCL's
  // own destroy returns once the peers that exchanged data on this comm destroyed theirs too.
  ~NcclCommunicator() override;

  int rank() const override { return state_->rank(); }
  int size() const override { return state_->size(); }
  Backend backend() const override { return Backend::nccl; }
  Device device() const override { return state_->device(); }
  const std::string& name() const override { return state_->name(); }

  using Communicator::all_reduce;
  Work all_reduce(const Tensor& in, const Tensor& out, ReduceOp op, const Stream& stream) override;
  Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                      const Stream& stream) override;
  Work all_gather(const Tensor& in, const Tensor& out, const Stream& stream) override;
  Work broadcast(const Tensor& inout, int root, const Stream& stream) override;
  Work reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
              const Stream& stream) override;
  Work all_to_all(const Tensor& in, const Tensor& out, const Stream& stream) override;
  Work all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                    const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                    const Stream& stream) override;
  Work send(const Tensor& in, int peer, const Stream& stream) override;
  Work recv(const Tensor& out, int peer, const Stream& stream) override;
  Work p2p(const std::vector<P2POp>& ops, const Stream& stream) override;
  Work barrier(const Stream& stream) override;
  // With members (Communicator::split's other form, which the Mesh uses) the split records as
  // '<name> (nccl)' with their world ranks, when this communicator records too; without them it
  // gathers them first over NcclOptions::split_exchange when there is one (quintet::init's NCCL
  // world under mpirun), else records nothing (its members' world ranks are unknown here).
  using Communicator::split;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override;

  // What the flight recorder keeps of an operation: dtype and element count of the tensor that
  // describes it, the peer or root (-1: none).
  struct Recorded {
    DType dtype = DType::f32;
    std::int64_t count = 0;
    int peer = -1;
  };

 private:
  // Issues one operation: orders the comm stream after `stream`, calls launch(comm_stream)
  // (which makes the NCCL calls and returns the last ncclResult_t), records the completion
  // event, records the operation in the flight recorder and hands the Work to the watchdog. The
  // caller adds the storages to keep.
  template <class Launch>
  std::shared_ptr<NcclWork> issue(const char* op, const Stream& stream, std::int64_t bytes,
                                  const Recorded& flight,
                                  Launch&& launch);  // bytes: what a trace records
  // The all-to-all of both forms: grouped ncclSend/ncclRecv, counts in elements per peer.
  Work exchange(const char* op, const Tensor& in, const std::vector<std::int64_t>& send_counts,
                const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                const Stream& stream);
  Tensor staging_for(const Tensor& in, const Tensor& out);
  std::unique_ptr<Communicator> split_with_members(int color, int key, const std::string& name,
                                                   const std::vector<int>& members) override;

  std::shared_ptr<NcclState> state_;
  ncclComm_t comm_;              // state_->comm(), cached for the hot path
  cudaStream_t comm_stream_;     // state_->stream().handle()
  cudaEvent_t ready_ = nullptr;  // recorded on the caller's stream by each operation
  std::uint64_t seq_ = 0;
  std::unique_ptr<Watchdog> watchdog_;    // the Works not yet seen complete
  std::shared_ptr<void> barrier_buffer_;  // one float on the GPU for barrier()
};

// A communicator over the ranks of control (a non-blocking NCCL comm, owned from here on; this
// rank is `rank` of `size`): splits off the blocking comm that runs the operations, bounded by
// options.timeout_s. Collective over control's ranks. On failure control is aborted and this
// throws.
std::unique_ptr<Communicator> communicator_over(ncclComm_t control, int rank, int size,
                                                const Device& device, const NcclOptions& options,
                                                const std::string& name);

}  // namespace quintet::detail
