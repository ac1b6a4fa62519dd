#include "collectives/mpi/mpi_communicator.hpp"

#include <algorithm>
#include <cstring>
#include <exception>
#include <numeric>

#include "collectives/mpi/mpi_types.hpp"
#include "collectives/validation.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/trace.hpp"

namespace quintet::detail {

namespace {

constexpr int kUserTag = 0;      // send, recv and p2p
constexpr int kExchangeTag = 1;  // the chunked all_to_all(_v) path
// How long the destruction of a failing communicator waits for its progress thread.
constexpr double kFailingJoinS = 1.0;

char* bytes(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Calls f(offset, count) over [0, n) in pieces of at most chunk elements.
template <class F>
void for_chunks(std::int64_t n, std::int64_t chunk, F&& f) {
  for (std::int64_t off = 0; off < n; off += chunk) {
    f(off, static_cast<int>(std::min(chunk, n - off)));
  }
}

void copy_bytes(void* dst, const void* src, std::size_t n) {
  if (n > 0 && dst != src) std::memcpy(dst, src, n);
}

// The flight recorder of a communicator over comm: its members' world ranks, added to the
// process's registry (when there is one).
std::shared_ptr<FlightRecorder> make_recorder(MPI_Comm comm, const std::string& name,
                                              const MpiOptions& options) {
  int rank = 0, size = 0;
  QUINTET_MPI_CHECK(MPI_Comm_rank(comm, &rank));
  QUINTET_MPI_CHECK(MPI_Comm_size(comm, &size));
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  QUINTET_MPI_CHECK(MPI_Comm_group(comm, &group));
  QUINTET_MPI_CHECK(MPI_Comm_group(MPI_COMM_WORLD, &world));
  std::vector<int> ranks(static_cast<std::size_t>(size)), world_ranks(ranks.size());
  std::iota(ranks.begin(), ranks.end(), 0);
  QUINTET_MPI_CHECK(
      MPI_Group_translate_ranks(group, size, ranks.data(), world, world_ranks.data()));
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  auto recorder = std::make_shared<FlightRecorder>(
      name, rank, std::move(world_ranks),
      options.flight ? options.flight->capacity() : options.flight_size);
  if (options.flight) options.flight->add(recorder);
  return recorder;
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, const MpiOptions& options)
    : comm_(comm),
      name_(std::move(name)),
      options_(options),
      flight_(make_recorder(comm, name_, options)),
      thread_(name_,
              std::chrono::microseconds(static_cast<std::int64_t>(options.idle_start_delay_us)),
              std::chrono::duration_cast<std::chrono::nanoseconds>(
                  std::chrono::duration<double>(options.timeout_s)),
              options.monitor, flight_) {
  QUINTET_CHECK(options_.max_chunk_elements > 0 && options_.max_chunk_elements <= INT_MAX,
                "MpiOptions::max_chunk_elements is {}; expected 1..{}", options_.max_chunk_elements,
                INT_MAX);
  QUINTET_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
  QUINTET_MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
  QUINTET_MPI_CHECK(MPI_Comm_size(comm_, &size_));
}

MpiCommunicator::~MpiCommunicator() {
  // A communicator whose operations failed or timed out, of a failing job, or destroyed while an
  // exception propagates may hold an operation whose peers never come: do not wait long for it.
  const bool failing = std::uncaught_exceptions() > 0 || thread_.broken();
  const bool joined = thread_.stop_and_join(failing ? kFailingJoinS : options_.timeout_s);
  flight_->retire();
  int finalized = 1;
  MPI_Finalized(&finalized);
  // A thread left behind may still be inside a call on comm_: then the communicator is leaked.
  if (joined && !finalized) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::describe(std::string_view op, std::uint64_t seq,
                                      const Tensor* t) const {
  const std::string what = t != nullptr && t->defined()
                               ? fmt::format(" ({} x {})", t->numel(), dtype_name(t->dtype()))
                               : std::string();
  return fmt::format("{} #{}{} on communicator '{}' (mpi, {} ranks)", op, seq, what, name_, size_);
}

Work MpiCommunicator::enqueue(const char* op, const Tensor* t, int peer, std::function<void()> fn) {
  std::optional<trace::TraceEvent> traced;
  if (trace::enabled()) {  // one branch when tracing is off
    traced.emplace();
    traced->name = std::string(op);
    traced->kind = trace::issue_kind(name_);
    traced->bytes = t != nullptr && t->defined() ? static_cast<std::int64_t>(t->nbytes()) : 0;
    traced->group = name_;
    traced->seq = static_cast<std::int64_t>(sequence_);
    traced->step = trace::current_step();
    traced->issue_us = trace::to_us(trace::Clock::now());
  }
  const bool has_tensor = t != nullptr && t->defined();
  const OpInfo info{op, static_cast<std::int64_t>(sequence_), has_tensor ? t->dtype() : DType::f32,
                    has_tensor ? t->numel() : 0, peer};
  const std::uint64_t seq = sequence_++;
  return thread_.submit(describe(op, seq, t), std::move(fn), std::move(traced), info);
}

Work MpiCommunicator::all_reduce(const Tensor& in, const Tensor& out, ReduceOp op, const Stream&) {
  validate_all_reduce(*this, in, out, op);
  return enqueue("all_reduce", &in, -1, [this, in, out, op] {
    const bool in_place = same_elements(in, out);
    const MPI_Datatype type = mpi_datatype(in.dtype());
    const MPI_Op mop = mpi_op(in.dtype(), op);
    const std::size_t es = in.element_size();
    for_chunks(in.numel(), options_.max_chunk_elements, [&](std::int64_t off, int count) {
      const void* src = in_place ? MPI_IN_PLACE : bytes(in) + off * es;
      QUINTET_MPI_CHECK(MPI_Allreduce(src, bytes(out) + off * es, count, type, mop, comm_));
    });
    if (op == ReduceOp::avg) divide_by(out.data_ptr(), out.dtype(), out.numel(), size_);
  });
}

void MpiCommunicator::run_reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op) const {
  const std::int64_t n = out.numel();
  const MPI_Datatype type = mpi_datatype(in.dtype());
  const MPI_Op mop = mpi_op(in.dtype(), op);
  const std::size_t es = in.element_size();
  // MPI forbids aliased send and receive buffers, and its in-place form puts the result in block
  // 0: an in-place call reduces into a scratch block first.
  const bool in_place = tensors_overlap(in, out);
  const Tensor dst = in_place ? Tensor::empty({n}, out.dtype()) : out;
  if (n * size_ <= options_.max_chunk_elements) {
    QUINTET_MPI_CHECK(
        MPI_Reduce_scatter_block(bytes(in), bytes(dst), static_cast<int>(n), type, mop, comm_));
  } else {
    for (int r = 0; r < size_; ++r) {
      for_chunks(n, options_.max_chunk_elements, [&](std::int64_t off, int count) {
        char* recv = r == rank_ ? bytes(dst) + off * es : nullptr;
        QUINTET_MPI_CHECK(
            MPI_Reduce(bytes(in) + (r * n + off) * es, recv, count, type, mop, r, comm_));
      });
    }
  }
  if (in_place) copy_bytes(out.data_ptr(), dst.data_ptr(), out.nbytes());
  if (op == ReduceOp::avg) divide_by(out.data_ptr(), out.dtype(), n, size_);
}

Work MpiCommunicator::reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op,
                                     const Stream&) {
  validate_reduce_scatter(*this, in, out, op);
  return enqueue("reduce_scatter", &out, -1,
                 [this, in, out, op] { run_reduce_scatter(in, out, op); });
}

void MpiCommunicator::run_all_gather(const Tensor& in, const Tensor& out) const {
  const std::int64_t n = in.numel();
  const MPI_Datatype type = mpi_datatype(in.dtype());
  const std::size_t es = in.element_size();
  const bool in_place = tensors_overlap(in, out);  // validated: in is block rank_ of out
  if (n * size_ <= options_.max_chunk_elements) {
    const void* src = in_place ? MPI_IN_PLACE : in.data_ptr();
    QUINTET_MPI_CHECK(MPI_Allgather(src, static_cast<int>(n), type, bytes(out), static_cast<int>(n),
                                    type, comm_));
    return;
  }
  copy_bytes(bytes(out) + rank_ * n * es, in.data_ptr(), in.nbytes());
  for (int r = 0; r < size_; ++r) {
    for_chunks(n, options_.max_chunk_elements, [&](std::int64_t off, int count) {
      QUINTET_MPI_CHECK(MPI_Bcast(bytes(out) + (r * n + off) * es, count, type, r, comm_));
    });
  }
}

Work MpiCommunicator::all_gather(const Tensor& in, const Tensor& out, const Stream&) {
  validate_all_gather(*this, in, out);
  return enqueue("all_gather", &in, -1, [this, in, out] { run_all_gather(in, out); });
}

Work MpiCommunicator::broadcast(const Tensor& inout, int root, const Stream&) {
  validate_broadcast(*this, inout, root);
  return enqueue("broadcast", &inout, root, [this, inout, root] {
    const MPI_Datatype type = mpi_datatype(inout.dtype());
    const std::size_t es = inout.element_size();
    for_chunks(inout.numel(), options_.max_chunk_elements, [&](std::int64_t off, int count) {
      QUINTET_MPI_CHECK(MPI_Bcast(bytes(inout) + off * es, count, type, root, comm_));
    });
  });
}

Work MpiCommunicator::reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
                             const Stream&) {
  validate_reduce(*this, in, out, op, root);
  const bool is_root = rank_ == root;
  return enqueue("reduce", &in, root, [this, in, out, op, root, is_root] {
    const bool in_place = is_root && same_elements(in, out);
    const MPI_Datatype type = mpi_datatype(in.dtype());
    const MPI_Op mop = mpi_op(in.dtype(), op);
    const std::size_t es = in.element_size();
    for_chunks(in.numel(), options_.max_chunk_elements, [&](std::int64_t off, int count) {
      const void* src = in_place ? MPI_IN_PLACE : bytes(in) + off * es;
      void* dst = is_root ? bytes(out) + off * es : nullptr;
      QUINTET_MPI_CHECK(MPI_Reduce(src, dst, count, type, mop, root, comm_));
    });
    if (is_root && op == ReduceOp::avg) {
      divide_by(out.data_ptr(), out.dtype(), out.numel(), size_);
    }
  });
}

void MpiCommunicator::exchange(const char* in, const std::vector<std::int64_t>& send_counts,
                               char* out, const std::vector<std::int64_t>& recv_counts,
                               DType dtype) const {
  const MPI_Datatype type = mpi_datatype(dtype);
  const std::size_t es = dtype_size(dtype);
  std::vector<MPI_Request> requests;
  std::int64_t recv_off = 0;
  for (int j = 0; j < size_; ++j) {
    for_chunks(recv_counts[j], options_.max_chunk_elements, [&](std::int64_t off, int count) {
      requests.emplace_back();
      QUINTET_MPI_CHECK(MPI_Irecv(out + (recv_off + off) * es, count, type, j, kExchangeTag, comm_,
                                  &requests.back()));
    });
    recv_off += recv_counts[j];
  }
  std::int64_t send_off = 0;
  for (int j = 0; j < size_; ++j) {
    for_chunks(send_counts[j], options_.max_chunk_elements, [&](std::int64_t off, int count) {
      requests.emplace_back();
      QUINTET_MPI_CHECK(MPI_Isend(in + (send_off + off) * es, count, type, j, kExchangeTag, comm_,
                                  &requests.back()));
    });
    send_off += send_counts[j];
  }
  QUINTET_MPI_CHECK(
      MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
}

Work MpiCommunicator::all_to_all(const Tensor& in, const Tensor& out, const Stream&) {
  validate_all_to_all(*this, in, out);
  return enqueue("all_to_all", &in, -1, [this, in, out] {
    const std::int64_t n = in.numel() / size_;
    const bool in_place = same_elements(in, out);
    if (in.numel() <= options_.max_chunk_elements) {
      const MPI_Datatype type = mpi_datatype(in.dtype());
      const void* src = in_place ? MPI_IN_PLACE : in.data_ptr();
      QUINTET_MPI_CHECK(MPI_Alltoall(src, static_cast<int>(n), type, out.data_ptr(),
                                     static_cast<int>(n), type, comm_));
      return;
    }
    const Tensor src = in_place ? in.clone() : in;
    const std::vector<std::int64_t> counts(size_, n);
    exchange(bytes(src), counts, bytes(out), counts, in.dtype());
  });
}

Work MpiCommunicator::all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                                   const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                                   const Stream&) {
  validate_all_to_all_v(*this, in, send_counts, out, recv_counts);
  return enqueue("all_to_all_v", &in, -1, [this, in, send_counts, out, recv_counts] {
    const Tensor src = same_elements(in, out) ? in.clone() : in;
    if (std::max(in.numel(), out.numel()) > options_.max_chunk_elements) {
      exchange(bytes(src), send_counts, bytes(out), recv_counts, in.dtype());
      return;
    }
    // Every count and offset fits in an int here.
    std::vector<int> sc(size_), sd(size_), rc(size_), rd(size_);
    for (int j = 0; j < size_; ++j) {
      sc[j] = static_cast<int>(send_counts[j]);
      rc[j] = static_cast<int>(recv_counts[j]);
      sd[j] = j == 0 ? 0 : sd[j - 1] + sc[j - 1];
      rd[j] = j == 0 ? 0 : rd[j - 1] + rc[j - 1];
    }
    const MPI_Datatype type = mpi_datatype(in.dtype());
    QUINTET_MPI_CHECK(MPI_Alltoallv(src.data_ptr(), sc.data(), sd.data(), type, out.data_ptr(),
                                    rc.data(), rd.data(), type, comm_));
  });
}

Work MpiCommunicator::send(const Tensor& in, int peer, const Stream&) {
  validate_send_recv(*this, "send", in, peer);
  return enqueue("send", &in, peer, [this, in, peer] {
    const MPI_Datatype type = mpi_datatype(in.dtype());
    const std::size_t es = in.element_size();
    for_chunks(in.numel(), options_.max_chunk_elements, [&](std::int64_t off, int count) {
      QUINTET_MPI_CHECK(MPI_Send(bytes(in) + off * es, count, type, peer, kUserTag, comm_));
    });
  });
}

Work MpiCommunicator::recv(const Tensor& out, int peer, const Stream&) {
  validate_send_recv(*this, "recv", out, peer);
  return enqueue("recv", &out, peer, [this, out, peer] {
    const MPI_Datatype type = mpi_datatype(out.dtype());
    const std::size_t es = out.element_size();
    for_chunks(out.numel(), options_.max_chunk_elements, [&](std::int64_t off, int count) {
      QUINTET_MPI_CHECK(
          MPI_Recv(bytes(out) + off * es, count, type, peer, kUserTag, comm_, MPI_STATUS_IGNORE));
    });
  });
}

Work MpiCommunicator::p2p(const std::vector<P2POp>& ops, const Stream&) {
  validate_p2p(*this, ops);
  const Tensor* first = ops.empty() ? nullptr : &ops.front().tensor;
  // The flight recorder notes the peer when there is one (a pipeline stage's step has one).
  int one_peer = ops.empty() ? -1 : ops.front().peer;
  for (const P2POp& op : ops) one_peer = op.peer == one_peer ? one_peer : -1;
  return enqueue("p2p", first, one_peer, [this, ops] {
    // One send and one receive (a ring or pipeline step): MPI_Sendrecv, the call a user would
    // make, which lets MPI pair the two transfers itself.
    if (ops.size() == 2 && ops[0].kind != ops[1].kind &&
        std::max(ops[0].tensor.numel(), ops[1].tensor.numel()) <= options_.max_chunk_elements) {
      const P2POp& snd = ops[0].kind == P2POp::Kind::send ? ops[0] : ops[1];
      const P2POp& rcv = ops[0].kind == P2POp::Kind::send ? ops[1] : ops[0];
      QUINTET_MPI_CHECK(MPI_Sendrecv(snd.tensor.data_ptr(), static_cast<int>(snd.tensor.numel()),
                                     mpi_datatype(snd.tensor.dtype()), snd.peer, kUserTag,
                                     rcv.tensor.data_ptr(), static_cast<int>(rcv.tensor.numel()),
                                     mpi_datatype(rcv.tensor.dtype()), rcv.peer, kUserTag, comm_,
                                     MPI_STATUS_IGNORE));
      return;
    }
    std::vector<MPI_Request> requests;
    // Receives first, so that every matching send finds its buffer posted.
    for (const bool receive : {true, false}) {
      for (const P2POp& op : ops) {
        if ((op.kind == P2POp::Kind::recv) != receive) continue;
        const MPI_Datatype type = mpi_datatype(op.tensor.dtype());
        const std::size_t es = op.tensor.element_size();
        char* base = bytes(op.tensor);
        for_chunks(op.tensor.numel(), options_.max_chunk_elements,
                   [&](std::int64_t off, int count) {
                     requests.emplace_back();
                     if (receive) {
                       QUINTET_MPI_CHECK(MPI_Irecv(base + off * es, count, type, op.peer, kUserTag,
                                                   comm_, &requests.back()));
                     } else {
                       QUINTET_MPI_CHECK(MPI_Isend(base + off * es, count, type, op.peer, kUserTag,
                                                   comm_, &requests.back()));
                     }
                   });
      }
    }
    QUINTET_MPI_CHECK(
        MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
  });
}

Work MpiCommunicator::barrier(const Stream&) {
  return enqueue("barrier", nullptr, -1, [this] { QUINTET_MPI_CHECK(MPI_Barrier(comm_)); });
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, const std::string& name) {
  MPI_Comm sub = MPI_COMM_NULL;
  // On the progress thread, so that the split is ordered with the operations queued before it.
  const auto seq = static_cast<std::int64_t>(sequence_++);
  thread_
      .submit(
          describe("split", seq, nullptr),
          [&] {
            QUINTET_MPI_CHECK(MPI_Comm_split(comm_, color < 0 ? MPI_UNDEFINED : color, key, &sub));
          },
          std::nullopt, OpInfo{"split", seq, DType::f32, 0, -1})
      .synchronize();
  if (sub == MPI_COMM_NULL) return nullptr;
  int sub_size = 0;
  QUINTET_MPI_CHECK(MPI_Comm_size(sub, &sub_size));
  if (sub_size == 1) {
    QUINTET_MPI_CHECK(MPI_Comm_free(&sub));
    return make_self_communicator(Device::cpu(), name);
  }
  return std::make_unique<MpiCommunicator>(sub, name, options_);
}

}  // namespace quintet::detail

namespace quintet {

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm comm, const std::string& name,
                                                    const MpiOptions& options) {
  int initialized = 0, finalized = 0, level = 0;
  QUINTET_MPI_CHECK(MPI_Initialized(&initialized));
  QUINTET_MPI_CHECK(MPI_Finalized(&finalized));
  QUINTET_CHECK(initialized && !finalized,
                "make_mpi_communicator('{}'): MPI is {}; call quintet::init() (or "
                "MPI_Init_thread with MPI_THREAD_MULTIPLE) first",
                name, finalized ? "already finalized" : "not initialised");
  QUINTET_MPI_CHECK(MPI_Query_thread(&level));
  QUINTET_CHECK(level == MPI_THREAD_MULTIPLE,
                "make_mpi_communicator('{}'): MPI was initialised with thread level {} but each "
                "communicator runs MPI calls on its own thread; initialise MPI with "
                "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...)",
                name, level);
  QUINTET_CHECK(comm != MPI_COMM_NULL, "make_mpi_communicator('{}'): comm is MPI_COMM_NULL", name);
  QUINTET_CHECK(options.timeout_s > 0,
                "make_mpi_communicator('{}'): MpiOptions::timeout_s is {}; expected a positive "
                "number of seconds",
                name, options.timeout_s);
  QUINTET_CHECK(options.idle_start_delay_us >= 0 && options.idle_start_delay_us <= 1e6,
                "make_mpi_communicator('{}'): MpiOptions::idle_start_delay_us is {}; expected 0 "
                "to 1000000 microseconds",
                name, options.idle_start_delay_us);
  int size = 0;
  QUINTET_MPI_CHECK(MPI_Comm_size(comm, &size));
  if (size == 1) return make_self_communicator(Device::cpu(), name);
  MPI_Comm dup = MPI_COMM_NULL;
  QUINTET_MPI_CHECK(MPI_Comm_dup(comm, &dup));
  return std::make_unique<detail::MpiCommunicator>(dup, name, options);
}

}  // namespace quintet
