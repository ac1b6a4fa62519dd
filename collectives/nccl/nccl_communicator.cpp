#include "collectives/nccl/nccl_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <utility>

#include "collectives/split_exchange.hpp"
#include "collectives/validation.hpp"
#include "quintet/collectives/mpi.hpp"
#include "quintet/core/allocator.hpp"
#include "quintet/core/device_guard.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"
#include "quintet/core/trace.hpp"

namespace quintet::detail {

namespace {

std::int64_t nbytes(const Tensor& t) { return static_cast<std::int64_t>(t.nbytes()); }
std::int64_t p2p_bytes(const std::vector<P2POp>& ops) {
  std::int64_t total = 0;
  for (const P2POp& op : ops) total += nbytes(op.tensor);
  return total;
}

// The NCCL reduction for op on a communicator of `size` ranks. On one rank avg is the identity
// (x / 1 == x exactly), and it must not reach NCCL there: NCCL (2.28) runs a one-rank avg through
// a special kernel (oneRankReduce) that splits the elements into 16-byte packs per block and
// never writes the last elements when the count is not a multiple of its grid (seen on an H200:
// the last 1-5 of 131077 f64 left unwritten). A one-rank sum is a plain copy.
ncclRedOp_t nccl_op(ReduceOp op, int size) {
  if (op == ReduceOp::avg && size == 1) return ncclSum;
  switch (op) {
    case ReduceOp::sum:
      return ncclSum;
    case ReduceOp::avg:
      return ncclAvg;
    case ReduceOp::max:
      return ncclMax;
    case ReduceOp::min:
      return ncclMin;
    case ReduceOp::prod:
      return ncclProd;
  }
  return ncclSum;
}

// What the flight recorder keeps of a p2p batch: its first tensor's dtype, the elements of all
// its tensors, and the peer when there is only one.
NcclCommunicator::Recorded p2p_recorded(const std::vector<P2POp>& ops) {
  NcclCommunicator::Recorded r;
  if (ops.empty()) return r;
  r.dtype = ops.front().tensor.dtype();
  r.peer = ops.front().peer;
  for (const P2POp& op : ops) {
    r.count += op.tensor.numel();
    if (op.peer != r.peer) r.peer = -1;
  }
  return r;
}

// Address of element `elements` of t (t contiguous).
void* element_ptr(const Tensor& t, std::int64_t elements) {
  return static_cast<char*>(t.data_ptr()) + static_cast<std::size_t>(elements) * t.element_size();
}

}  // namespace

// In place, the sends of an all-to-all would read blocks that its receives overwrite, so they send
// from a copy: allocated in the comm stream's pool (so no other stream can reuse the block while
// NCCL reads it) and filled on the comm stream inside the operation, after the caller's work.
// Returns an undefined tensor when not in place.
Tensor NcclCommunicator::staging_for(const Tensor& in, const Tensor& out) {
  if (in.numel() == 0 || !same_elements(in, out)) return Tensor();
  return Tensor::from_storage(cuda_allocate(in.nbytes(), device(), state_->stream()), in.nbytes(),
                              {in.numel()}, in.dtype(), device());
}

NcclCommunicator::NcclCommunicator(std::shared_ptr<NcclState> state)
    : state_(std::move(state)), comm_(state_->comm()), comm_stream_(state_->stream().handle()) {
  DeviceGuard guard(state_->device());
  QUINTET_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  // Allocated on the comm stream (its pool), which is the only stream that ever touches it.
  barrier_buffer_ = cuda_allocate(sizeof(float), state_->device(), state_->stream());
  QUINTET_CUDA_CHECK(cudaMemsetAsync(barrier_buffer_.get(), 0, sizeof(float), comm_stream_));
  const auto timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(state_->timeout_s()));
  // The handler holds the state, not this communicator: the watchdog is stopped before either goes.
  watchdog_ = std::make_unique<Watchdog>(
      state_->name(), timeout, Watchdog::period_for(timeout),
      [state = state_](Watchdog::Op& op, std::chrono::nanoseconds pending) {
        // Only NcclWorks are added to it (issue).
        return state->expired(static_cast<NcclWork&>(op),
                              std::chrono::duration<double>(pending).count());
      });
}

NcclCommunicator::~NcclCommunicator() {
  // First, so that the watchdog cannot abort or end the process while the comm is shut down (a
  // bounded wait); the Works it still held stay here until the comm stream is seen idle.
  std::deque<std::shared_ptr<Watchdog::Op>> pending = watchdog_->stop();
  if (state_->recorder()) state_->recorder()->retire();
  state_->shutdown();
  bool idle = false;
  {
    QuietDeviceGuard guard(state_->device());
    // Bounded: the comm stream may be held back forever by a caller's stream it waits on.
    idle = stream_idle_within(comm_stream_, state_->timeout_s());
    // Safe while the comm stream still waits on it: CUDA frees it once that wait is resolved.
    if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
    (void)cudaGetLastError();
  }
  if (!idle) {
    // Operations still queued may yet read or write their tensors, so their blocks must never go
    // back to a pool: leak the pending Works (and the storages they hold) on purpose.
    log::warn(
        "{}: destroyed while its comm stream was still busy after {} s (an operation waits "
        "on work that never finished); leaking the tensors of {} unfinished operations",
        state_->describe(), state_->timeout_s(), pending.size());
    (void)new std::deque<std::shared_ptr<Watchdog::Op>>(std::move(pending));  // intentional leak
  }
  pending.clear();  // every operation has finished: the tensors can go back to their pools
}

template <class Launch>
std::shared_ptr<NcclWork> NcclCommunicator::issue(const char* op, const Stream& stream,
                                                  std::int64_t bytes, const Recorded& flight,
                                                  Launch&& launch) {
  QUINTET_CHECK(!stream.device().is_cuda() || stream.device() == state_->device(),
                "{} on {}: the stream is on {} but the communicator's GPU is {}; issue the "
                "operation on a stream of {}",
                op, state_->describe(), stream.device().str(), state_->device().str(),
                state_->device().str());
  state_->check_usable(op);
  // Only switches the current device when the calling thread is on another GPU.
  DeviceGuard guard(state_->device());
  // A CPU stream (the default argument) means the GPU's legacy default stream.
  cudaStream_t caller = stream.device().is_cuda() ? stream.handle() : nullptr;
  if (caller != comm_stream_) {
    QUINTET_CUDA_CHECK(cudaEventRecord(ready_, caller));
    QUINTET_CUDA_CHECK(cudaStreamWaitEvent(comm_stream_, ready_, 0));
  }
  // Traced: the operation on the comm stream, between an event before its launch and one after.
  std::optional<trace::TraceEvent> traced;
  std::optional<Stream> comm;
  int slot = -1;
  if (trace::enabled()) {  // one branch when tracing is off
    comm.emplace(Stream::borrow(state_->device(), comm_stream_));
    traced.emplace();
    traced->name = op;
    traced->kind = trace::issue_kind(name());
    traced->bytes = bytes;
    traced->group = name();
    traced->seq = static_cast<std::int64_t>(seq_ + 1);
    slot = trace::begin_gpu(*traced, *comm);
  }
  const ncclResult_t r = launch(comm_stream_);
  if (r == ncclInProgress) {
    state_->wait_launched(op);  // a non-blocking comm finished launching in the background
  } else if (r != ncclSuccess) {
    state_->throw_failure(r, fmt::format("{} #{}", op, seq_ + 1));
  }
  cudaEvent_t done = state_->acquire_event();
  const cudaError_t recorded = cudaEventRecord(done, comm_stream_);
  if (recorded != cudaSuccess) {
    state_->release_event(done);
    QUINTET_CUDA_CHECK(recorded);
  }
  if (comm) trace::end_gpu(slot, *comm);
  auto work = std::make_shared<NcclWork>(state_, op, ++seq_, flight.peer, done);
  if (traced) work->set_trace(std::move(*traced));
  if (const auto& recorder = state_->recorder()) {
    recorder->enqueued(static_cast<std::int64_t>(seq_), op, flight.dtype, flight.count,
                       flight.peer);
  }
  watchdog_->add(work);
  return work;
}

Work NcclCommunicator::all_reduce(const Tensor& in, const Tensor& out, ReduceOp op,
                                  const Stream& stream) {
  validate_all_reduce(*this, in, out, op);
  auto work =
      issue("all_reduce", stream, nbytes(in), {in.dtype(), in.numel()}, [&](cudaStream_t s) {
        if (in.numel() == 0) return ncclSuccess;  // every rank has 0 elements: nothing to move
        return ncclAllReduce(in.data_ptr(), out.data_ptr(), static_cast<std::size_t>(in.numel()),
                             nccl_datatype(in.dtype()), nccl_op(op, size()), comm_, s);
      });
  work->keep(in.storage());
  work->keep(out.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                      const Stream& stream) {
  validate_reduce_scatter(*this, in, out, op);
  auto work =
      issue("reduce_scatter", stream, nbytes(in), {in.dtype(), in.numel()}, [&](cudaStream_t s) {
        if (out.numel() == 0) return ncclSuccess;
        return ncclReduceScatter(in.data_ptr(), out.data_ptr(),
                                 static_cast<std::size_t>(out.numel()), nccl_datatype(in.dtype()),
                                 nccl_op(op, size()), comm_, s);
      });
  work->keep(in.storage());
  work->keep(out.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::all_gather(const Tensor& in, const Tensor& out, const Stream& stream) {
  validate_all_gather(*this, in, out);
  auto work =
      issue("all_gather", stream, nbytes(out), {in.dtype(), in.numel()}, [&](cudaStream_t s) {
        if (in.numel() == 0) return ncclSuccess;
        return ncclAllGather(in.data_ptr(), out.data_ptr(), nccl_count(in.dtype(), in.numel()),
                             nccl_datatype(in.dtype()), comm_, s);
      });
  work->keep(in.storage());
  work->keep(out.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::broadcast(const Tensor& inout, int root, const Stream& stream) {
  validate_broadcast(*this, inout, root);
  auto work = issue("broadcast", stream, nbytes(inout), {inout.dtype(), inout.numel(), root},
                    [&](cudaStream_t s) {
                      if (inout.numel() == 0) return ncclSuccess;
                      return ncclBroadcast(inout.data_ptr(), inout.data_ptr(),
                                           nccl_count(inout.dtype(), inout.numel()),
                                           nccl_datatype(inout.dtype()), root, comm_, s);
                    });
  work->keep(inout.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
                              const Stream& stream) {
  validate_reduce(*this, in, out, op, root);
  const bool is_root = rank() == root;
  // Off the root NCCL ignores the receive buffer; pass in's so that no pointer is null.
  void* recv = is_root ? out.data_ptr() : in.data_ptr();
  auto work =
      issue("reduce", stream, nbytes(in), {in.dtype(), in.numel(), root}, [&](cudaStream_t s) {
        if (in.numel() == 0) return ncclSuccess;
        return ncclReduce(in.data_ptr(), recv, static_cast<std::size_t>(in.numel()),
                          nccl_datatype(in.dtype()), nccl_op(op, size()), root, comm_, s);
      });
  work->keep(in.storage());
  if (is_root) work->keep(out.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::all_to_all(const Tensor& in, const Tensor& out, const Stream& stream) {
  validate_all_to_all(*this, in, out);
  const std::int64_t block = in.numel() / size();
  const std::vector<std::int64_t> counts(static_cast<std::size_t>(size()), block);
  return exchange("all_to_all", in, counts, out, counts, stream);
}

Work NcclCommunicator::all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                                    const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                                    const Stream& stream) {
  validate_all_to_all_v(*this, in, send_counts, out, recv_counts);
  return exchange("all_to_all_v", in, send_counts, out, recv_counts, stream);
}

Work NcclCommunicator::exchange(const char* op, const Tensor& in,
                                const std::vector<std::int64_t>& send_counts, const Tensor& out,
                                const std::vector<std::int64_t>& recv_counts,
                                const Stream& stream) {
  const ncclDataType_t type = nccl_datatype(in.dtype());
  const Tensor staging = staging_for(in, out);
  const Tensor& src = staging.defined() ? staging : in;
  auto work = issue(
      op, stream, std::max(nbytes(in), nbytes(out)), {in.dtype(), in.numel()}, [&](cudaStream_t s) {
        if (staging.defined()) {
          QUINTET_CUDA_CHECK(cudaMemcpyAsync(staging.data_ptr(), in.data_ptr(), in.nbytes(),
                                             cudaMemcpyDeviceToDevice, s));
        }
        ncclResult_t r = ncclGroupStart();
        std::int64_t send_offset = 0, recv_offset = 0;
        for (int peer = 0; peer < size() && r == ncclSuccess; ++peer) {
          const std::int64_t sc = send_counts[static_cast<std::size_t>(peer)];
          const std::int64_t rc = recv_counts[static_cast<std::size_t>(peer)];
          if (sc > 0) {
            r = ncclSend(element_ptr(src, send_offset), nccl_count(in.dtype(), sc), type, peer,
                         comm_, s);
          }
          if (rc > 0 && r == ncclSuccess) {
            r = ncclRecv(element_ptr(out, recv_offset), nccl_count(out.dtype(), rc), type, peer,
                         comm_, s);
          }
          send_offset += sc;
          recv_offset += rc;
        }
        const ncclResult_t end = ncclGroupEnd();
        return r != ncclSuccess ? r : end;
      });
  work->keep(in.storage());
  work->keep(out.storage());
  if (staging.defined()) work->keep(staging.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::send(const Tensor& in, int peer, const Stream& stream) {
  validate_send_recv(*this, "send", in, peer);
  auto work =
      issue("send", stream, nbytes(in), {in.dtype(), in.numel(), peer}, [&](cudaStream_t s) {
        return ncclSend(in.data_ptr(), nccl_count(in.dtype(), in.numel()),
                        nccl_datatype(in.dtype()), peer, comm_, s);
      });
  work->keep(in.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::recv(const Tensor& out, int peer, const Stream& stream) {
  validate_send_recv(*this, "recv", out, peer);
  auto work =
      issue("recv", stream, nbytes(out), {out.dtype(), out.numel(), peer}, [&](cudaStream_t s) {
        return ncclRecv(out.data_ptr(), nccl_count(out.dtype(), out.numel()),
                        nccl_datatype(out.dtype()), peer, comm_, s);
      });
  work->keep(out.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::p2p(const std::vector<P2POp>& ops, const Stream& stream) {
  validate_p2p(*this, ops);
  auto work = issue("p2p", stream, p2p_bytes(ops), p2p_recorded(ops), [&](cudaStream_t s) {
    ncclResult_t r = ncclGroupStart();
    for (std::size_t i = 0; i < ops.size() && r == ncclSuccess; ++i) {
      const Tensor& t = ops[i].tensor;
      const std::size_t count = nccl_count(t.dtype(), t.numel());
      r = ops[i].kind == P2POp::Kind::send
              ? ncclSend(t.data_ptr(), count, nccl_datatype(t.dtype()), ops[i].peer, comm_, s)
              : ncclRecv(t.data_ptr(), count, nccl_datatype(t.dtype()), ops[i].peer, comm_, s);
    }
    const ncclResult_t end = ncclGroupEnd();
    return r != ncclSuccess ? r : end;
  });
  for (const P2POp& p : ops) work->keep(p.tensor.storage());
  return Work(std::move(work));
}

Work NcclCommunicator::barrier(const Stream& stream) {
  return Work(issue("barrier", stream, 0, {}, [&](cudaStream_t s) {
    return ncclAllReduce(barrier_buffer_.get(), barrier_buffer_.get(), 1, ncclFloat32, ncclSum,
                         comm_, s);
  }));
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, const std::string& name) {
  if (state_->recorder() && state_->split_exchange()) {
    // The members over MPI, before any NCCL call, so that the split records too.
    state_->check_usable("split");
    const std::vector<int> members =
        state_->split_exchange()->members(color, key, state_->timeout_s(),
                                          fmt::format("split of {} into '{}' (color {}, key {})",
                                                      state_->describe(), name, color, key));
    return Communicator::split(color, key, name, members);
  }
  return split_with_members(color, key, name, {});
}

std::unique_ptr<Communicator> NcclCommunicator::split_with_members(
    int color, int key, const std::string& name, const std::vector<int>& members) {
  // Before any NCCL call: a member that is not a rank of this communicator throws here.
  NcclOptions options = state_->split_options(members);
  state_->check_usable("split");
  watchdog_->reap();
  DeviceGuard guard(device());
  const std::string what = fmt::format("split into '{}' (color {}, key {})", name, color, key);
  // Split the non-blocking control comm, so that a rank that never calls split is a timeout.
  // NCCL writes the child handle when the split has finished in the background.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t child = nullptr;
  ncclResult_t r = ncclCommSplit(state_->control(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                 &child, &config);
  if (r == ncclSuccess || r == ncclInProgress) {
    r = nccl_wait_not_in_progress(state_->control(), state_->timeout_s());
  }
  if (r == ncclInProgress) {
    const std::string message = fmt::format(
        "{} of {} did not complete within {} s: some rank of the parent did not call split "
        "(every rank must, with color < 0 for no group); the communicator is aborted",
        what, state_->describe(), state_->timeout_s());
    state_->abort(message);
    QUINTET_THROW(Timeout, "{}", message);
  }
  if (r != ncclSuccess) state_->throw_failure(r, what);
  if (child == nullptr) return nullptr;
  int child_rank = 0, child_size = 0;
  r = ncclCommUserRank(child, &child_rank);
  if (r == ncclSuccess) r = ncclCommCount(child, &child_size);
  if (r != ncclSuccess) {
    (void)ncclCommAbort(child);
    state_->throw_failure(r, what);
  }
  if (static_cast<int>(options.world_ranks.size()) != child_size ||
      (!members.empty() && members[static_cast<std::size_t>(child_rank)] != rank())) {
    // Not the group the members say (Communicator::split refuses it once made): record nothing
    // rather than under wrong world ranks.
    options.world_ranks.clear();
  }
  if (child_size == 1) {
    // The header's promise: a group of one rank gets the Self backend (local copies, no NCCL).
    nccl_destroy(child, state_->timeout_s());
    return make_self_communicator(device(), name);
  }
  return communicator_over(child, child_rank, child_size, device(), options, name);
}

std::unique_ptr<Communicator> communicator_over(ncclComm_t control, int rank, int size,
                                                const Device& device, const NcclOptions& options,
                                                const std::string& name) {
  const double timeout_s = options.timeout_s;
  // The operations comm: a blocking split of control with the same ranks in the same order. It
  // is issued on the non-blocking control comm, so the wait for it stays bounded.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 1;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommSplit(control, 0, rank, &comm, &config);
  if (r == ncclSuccess || r == ncclInProgress) r = nccl_wait_not_in_progress(control, timeout_s);
  if (r != ncclSuccess || comm == nullptr) {
    const char* last = ncclGetLastError(nullptr);
    (void)ncclCommAbort(control);
    if (comm != nullptr) (void)ncclCommAbort(comm);
    if (r == ncclInProgress) {
      QUINTET_THROW(Timeout,
                    "NCCL communicator '{}': rank {} of {} on {} could not create its operations "
                    "communicator within {} s; a rank stopped during initialisation",
                    name, rank, size, device.str(), timeout_s);
    }
    QUINTET_THROW(Nccl,
                  "NCCL communicator '{}': creating the operations communicator of rank {} of {} "
                  "on {} failed: {} (NCCL code {}){}{}",
                  name, rank, size, device.str(), ncclGetErrorString(r), static_cast<int>(r),
                  last && *last ? ": " : "", last ? last : "");
  }
  std::shared_ptr<NcclState> state;
  try {
    state = std::make_shared<NcclState>(comm, control, device, rank, size, name, options);
  } catch (...) {
    (void)ncclCommAbort(comm);
    (void)ncclCommAbort(control);
    throw;
  }
  // From here the state owns both comms (and aborts them if construction fails).
  return std::make_unique<NcclCommunicator>(std::move(state));
}

// ---- Entry points for bootstrap ----

std::vector<char> nccl_make_unique_id() {
  ncclUniqueId id;
  QUINTET_NCCL_CHECK(ncclGetUniqueId(&id));
  return std::vector<char>(id.internal, id.internal + sizeof(id.internal));
}

std::unique_ptr<Communicator> nccl_create_communicator(const std::vector<char>& unique_id, int rank,
                                                       int size, const Device& device,
                                                       double timeout_s, const std::string& name) {
  NcclOptions options;
  options.timeout_s = timeout_s;
  return nccl_create_communicator(unique_id, rank, size, device, options, name);
}

std::unique_ptr<Communicator> nccl_create_communicator(const std::vector<char>& unique_id, int rank,
                                                       int size, const Device& device,
                                                       const NcclOptions& options,
                                                       const std::string& name) {
  const double timeout_s = options.timeout_s;
  ncclUniqueId id;
  QUINTET_CHECK(unique_id.size() == sizeof(id.internal),
                "NCCL communicator '{}': the unique id has {} bytes; expected {} (the bytes of "
                "nccl_make_unique_id on one rank, sent unchanged to all)",
                name, unique_id.size(), sizeof(id.internal));
  QUINTET_CHECK(size >= 1 && rank >= 0 && rank < size,
                "NCCL communicator '{}': rank {} of size {}; expected size >= 1 and 0 <= rank < "
                "size",
                name, rank, size);
  QUINTET_CHECK(
      options.world_ranks.empty() || options.world_ranks.size() == static_cast<std::size_t>(size),
      "NCCL communicator '{}': {} world ranks given for its {} ranks; give one per rank "
      "(the world rank of each, in order) or none",
      name, options.world_ranks.size(), size);
  QUINTET_CHECK(device.is_cuda(),
                "NCCL communicator '{}': device {} is not a GPU; NCCL moves CUDA tensors, use the "
                "MPI communicator for the CPU",
                name, device.str());
  QUINTET_CHECK(timeout_s > 0, "NCCL communicator '{}': timeout {} s must be positive", name,
                timeout_s);
  check_device(device);
  std::copy(unique_id.begin(), unique_id.end(), id.internal);

  DeviceGuard guard(device);  // NCCL binds the communicator to the current device
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing rank is a timeout here, not a hang
  ncclComm_t control = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&control, size, id, rank, &config);
  if (r == ncclSuccess || r == ncclInProgress) r = nccl_wait_not_in_progress(control, timeout_s);
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    if (control != nullptr) (void)ncclCommAbort(control);
    if (r == ncclInProgress) {
      QUINTET_THROW(Timeout,
                    "NCCL communicator '{}': rank {} of {} on {} did not finish initialisation "
                    "within {} s; some of the {} ranks never arrived (check that every rank "
                    "calls init with the same unique id) or the network is unreachable",
                    name, rank, size, device.str(), timeout_s, size);
    }
    QUINTET_THROW(Nccl,
                  "NCCL communicator '{}': initialisation of rank {} of {} on {} failed: {} "
                  "(NCCL code {}){}{}",
                  name, rank, size, device.str(), ncclGetErrorString(r), static_cast<int>(r),
                  last && *last ? ": " : "", last ? last : "");
  }
  return communicator_over(control, rank, size, device, options, name);
}

}  // namespace quintet::detail
