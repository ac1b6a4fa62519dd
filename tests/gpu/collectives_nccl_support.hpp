// Helpers of the NCCL communicator tests (run under mpirun, one GPU per rank): a fresh NCCL
// communicator over MPI_COMM_WORLD, and the operation suite of tests/mpi run on CUDA tensors.
//
// Inputs and references come from tests/mpi/collectives_support.hpp: each rank's input is a pure
// function of (rank, seed, index), so every rank computes the expected output locally, in double
// on the CPU. Inputs are made on the host and copied to the GPU (synchronously); outputs are read
// back after Work::wait(stream) and a synchronisation of that stream.
#pragma once

#include <mpi.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "collectives/nccl/nccl_backend.hpp"
#include "mpi/collectives_support.hpp"
#include "quintet/collectives/communicator.hpp"

namespace quintet::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

// This rank's GPU: cuda:(rank among the processes of this node).
inline Device local_gpu() {
  MPI_Comm local;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, world_rank(), MPI_INFO_NULL, &local);
  int local_rank = 0;
  MPI_Comm_rank(local, &local_rank);
  MPI_Comm_free(&local);
  return Device::cuda(local_rank);
}

// A new NCCL communicator over all ranks: rank 0 makes the unique id, MPI_Bcast sends it.
inline std::unique_ptr<Communicator> make_nccl_world(const std::string& name,
                                                     const detail::NcclOptions& options) {
  std::vector<char> id;
  if (world_rank() == 0) id = detail::nccl_make_unique_id();
  int bytes = static_cast<int>(id.size());
  MPI_Bcast(&bytes, 1, MPI_INT, 0, MPI_COMM_WORLD);
  id.resize(static_cast<std::size_t>(bytes));
  MPI_Bcast(id.data(), bytes, MPI_CHAR, 0, MPI_COMM_WORLD);
  return detail::nccl_create_communicator(id, world_rank(), world_size(), local_gpu(), options,
                                          name);
}
inline std::unique_ptr<Communicator> make_nccl_world(const std::string& name,
                                                     double timeout_s = 120.0) {
  detail::NcclOptions options;
  options.timeout_s = timeout_s;
  return make_nccl_world(name, options);
}

// t on the host, once work has finished: stream waits for it, then the host waits for stream.
inline Tensor host_after(const Tensor& t, const Work& work, const Stream& stream) {
  work.wait(stream);
  stream.synchronize();
  return t.to(Device::cpu());
}

// A GPU output of n elements filled with a value no reduction of the test inputs can give (they
// stay within +-8 per rank, +-16 for prod), so an element the operation leaves unwritten always
// shows as a mismatch instead of passing on a recycled block that held the right values.
inline Tensor sentinel_output(std::int64_t n, DType dt, const Device& device) {
  return Tensor::full({n}, 123.0, dt).to(device);  // host fill, synchronous copy
}

// Whether every backend reduces dt with op: not u16 (NCCL has no such type), avg only for
// floating dtypes.
inline bool reducible_everywhere(DType dt, ReduceOp op) {
  return dt != DType::u16 && (op != ReduceOp::avg || is_floating(dt));
}

inline constexpr ReduceOp kAllReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                             ReduceOp::min, ReduceOp::prod};

// Sizes per rank, in elements: empty, one, odd, ~1 MiB and ~3 MiB.
inline std::vector<std::int64_t> gpu_sizes(DType dt) {
  const auto per_mib = static_cast<std::int64_t>((1 << 20) / dtype_size(dt));
  return {0, 1, 37, per_mib + 5, 3 * per_mib + 1};
}

inline void gpu_all_reduce(Communicator& c, const Stream& s, DType dt, std::int64_t n,
                           std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  for (ReduceOp op : kAllReduceOps) {
    if (!reducible_everywhere(dt, op)) continue;
    for (bool in_place : {false, true}) {
      const Tensor in = make_input(me, seed, n, dt, values_for(op)).to(c.device());
      const Tensor out = in_place ? in : sentinel_output(n, dt, c.device());
      const Work w = c.all_reduce(in, out, op, s);
      check_values(
          host_after(out, w, s), 0, n, [&](std::int64_t i) { return reduced(op, p, seed, i, dt); },
          op == ReduceOp::avg,
          fmt::format("all_reduce {} in_place={}", reduce_op_name(op), in_place));
    }
  }
}

inline void gpu_reduce_scatter(Communicator& c, const Stream& s, DType dt, std::int64_t n,
                               std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  for (ReduceOp op : kAllReduceOps) {
    if (!reducible_everywhere(dt, op)) continue;
    for (bool in_place : {false, true}) {
      const Tensor in = make_input(me, seed, n * p, dt, values_for(op)).to(c.device());
      const Tensor out = in_place ? in.narrow(0, me * n, n) : sentinel_output(n, dt, c.device());
      const Work w = c.reduce_scatter(in, out, op, s);
      check_values(
          host_after(out, w, s), 0, n,
          [&](std::int64_t i) { return reduced(op, p, seed, me * n + i, dt); }, op == ReduceOp::avg,
          fmt::format("reduce_scatter {} in_place={}", reduce_op_name(op), in_place));
    }
  }
}

inline void gpu_reduce(Communicator& c, const Stream& s, DType dt, std::int64_t n,
                       std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  for (int root : {0, p - 1}) {
    for (ReduceOp op : kAllReduceOps) {
      if (!reducible_everywhere(dt, op)) continue;
      const Tensor in = make_input(me, seed, n, dt, values_for(op)).to(c.device());
      const Tensor out = me == root ? sentinel_output(n, dt, c.device()) : Tensor();
      const Work w = c.reduce(in, out, op, root, s);
      if (me == root) {
        check_values(
            host_after(out, w, s), 0, n,
            [&](std::int64_t i) { return reduced(op, p, seed, i, dt); }, op == ReduceOp::avg,
            fmt::format("reduce {} to root {}", reduce_op_name(op), root));
      } else {
        w.synchronize();
      }
    }
  }
}

inline void gpu_data_movement(Communicator& c, const Stream& s, DType dt, std::int64_t n,
                              std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  const std::int64_t block = std::max<std::int64_t>(n, 1);
  auto mv = [&](int r, std::int64_t i) { return gen(r, seed, i, dt, Values::move); };
  for (bool in_place : {false, true}) {
    const std::string how = fmt::format(" in_place={}", in_place);
    {  // all_gather: block r of out is rank r's in
      const Tensor out = Tensor::empty({n * p}, dt, c.device());
      Tensor in = make_input(me, seed, n, dt, Values::move).to(c.device());
      if (in_place) {
        out.narrow(0, me * n, n).copy_(in);
        in = out.narrow(0, me * n, n);
      }
      const Work w = c.all_gather(in, out, s);
      check_values(
          host_after(out, w, s), 0, n * p,
          [&](std::int64_t k) { return mv(static_cast<int>(k / block), k % block); }, false,
          "all_gather" + how);
    }
    {  // all_to_all: block j of rank i's in becomes block i of rank j's out
      const Tensor in = make_input(me, seed, n * p, dt, Values::move).to(c.device());
      const Tensor out = in_place ? in : Tensor::empty({n * p}, dt, c.device());
      const Work w = c.all_to_all(in, out, s);
      check_values(
          host_after(out, w, s), 0, n * p,
          [&](std::int64_t k) { return mv(static_cast<int>(k / block), me * n + k % block); },
          false, "all_to_all" + how);
    }
  }
  for (int root : {0, p - 1}) {
    const Tensor t = make_input(me, seed, n, dt, Values::move).to(c.device());
    const Work w = c.broadcast(t, root, s);
    check_values(
        host_after(t, w, s), 0, n, [&](std::int64_t i) { return mv(root, i); }, false,
        fmt::format("broadcast from root {}", root));
  }
  // all_to_all_v: rank r sends count(r, j) elements to rank j; some counts are 0.
  auto count = [&](int r, int j) -> std::int64_t { return ((r * 3 + j * 5) % 4) * n / 2; };
  std::vector<std::int64_t> sc(static_cast<std::size_t>(p)), rc(static_cast<std::size_t>(p));
  for (int j = 0; j < p; ++j) {
    sc[static_cast<std::size_t>(j)] = count(me, j);
    rc[static_cast<std::size_t>(j)] = count(j, me);
  }
  const std::int64_t ns = std::accumulate(sc.begin(), sc.end(), std::int64_t{0});
  const std::int64_t nr = std::accumulate(rc.begin(), rc.end(), std::int64_t{0});
  const Tensor in = make_input(me, seed, ns, dt, Values::move).to(c.device());
  const Tensor out = Tensor::empty({nr}, dt, c.device());
  const Tensor got = host_after(out, c.all_to_all_v(in, sc, out, rc, s), s);
  std::int64_t at = 0;
  for (int j = 0; j < p; ++j) {
    std::int64_t from = 0;  // where rank j's elements for this rank start in its input
    for (int k = 0; k < me; ++k) from += count(j, k);
    check_values(
        got, at, rc[static_cast<std::size_t>(j)], [&](std::int64_t i) { return mv(j, from + i); },
        false, fmt::format("all_to_all_v from rank {}", j));
    at += rc[static_cast<std::size_t>(j)];
  }
}

inline void gpu_point_to_point(Communicator& c, const Stream& s, DType dt, std::int64_t n,
                               std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  auto mv = [&](int r, std::int64_t i) { return gen(r, seed, i, dt, Values::move); };
  const Tensor mine = make_input(me, seed, n, dt, Values::move).to(c.device());
  const int partner = me % 2 == 0 ? me + 1 : me - 1;  // pairs (0,1), (2,3), ...
  if (partner < p) {
    const Tensor theirs = Tensor::empty({n}, dt, c.device());
    const Work first = me % 2 == 0 ? c.send(mine, partner, s) : c.recv(theirs, partner, s);
    const Work second = me % 2 == 0 ? c.recv(theirs, partner, s) : c.send(mine, partner, s);
    first.wait(s);
    check_values(
        host_after(theirs, second, s), 0, n, [&](std::int64_t i) { return mv(partner, i); }, false,
        fmt::format("recv from {}", partner));
  }
  // One batch: a ring in both directions plus a message to itself.
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  const Tensor from_prev = Tensor::empty({n}, dt, c.device());
  const Tensor from_next = Tensor::empty({n}, dt, c.device());
  const Tensor from_self = Tensor::empty({n}, dt, c.device());
  const Work w =
      c.p2p({P2POp::send(mine, next), P2POp::send(mine, prev), P2POp::recv(from_prev, prev),
             P2POp::recv(from_next, next), P2POp::send(mine, me), P2POp::recv(from_self, me)},
            s);
  check_values(
      host_after(from_prev, w, s), 0, n, [&](std::int64_t i) { return mv(prev, i); }, false,
      "p2p from prev");
  check_values(
      from_next.to(Device::cpu()), 0, n, [&](std::int64_t i) { return mv(next, i); }, false,
      "p2p from next");
  check_values(
      from_self.to(Device::cpu()), 0, n, [&](std::int64_t i) { return mv(me, i); }, false,
      "p2p from self");
}

// Every operation x every dtype x sizes on c, issued on stream s.
inline void run_gpu_suite(Communicator& c, const Stream& s, std::uint64_t seed,
                          const std::vector<std::int64_t>& sizes = {}) {
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : sizes.empty() ? gpu_sizes(dt) : sizes) {
      INFO("communicator " << c.name() << " rank " << c.rank() << "/" << c.size() << " dtype "
                           << dtype_name(dt) << " n " << n);
      gpu_all_reduce(c, s, dt, n, ++seed);
      gpu_reduce_scatter(c, s, dt, n, ++seed);
      gpu_reduce(c, s, dt, n, ++seed);
      gpu_data_movement(c, s, dt, n, ++seed);
      gpu_point_to_point(c, s, dt, n, ++seed);
    }
  }
  c.barrier(s).synchronize();
}

}  // namespace quintet::test
