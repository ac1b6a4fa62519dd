// The operation suite run on any communicator (world, split groups, small-chunk MPI): every
// operation, in and out of place, against the reference of collectives_support.hpp.
#pragma once

#include <numeric>

#include "collectives_support.hpp"
#include "quintet/collectives/communicator.hpp"

namespace quintet::test {

inline constexpr ReduceOp kReduceOps[] = {ReduceOp::sum, ReduceOp::avg, ReduceOp::max,
                                          ReduceOp::min, ReduceOp::prod};

inline bool reducible(DType dt, ReduceOp op) {
  if (dt == DType::u16) return false;
  return op != ReduceOp::avg || is_floating(dt);
}

inline void check_all_reduce(Communicator& c, DType dt, std::int64_t n, std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  for (ReduceOp op : kReduceOps) {
    if (!reducible(dt, op)) continue;
    for (bool in_place : {false, true}) {
      const Tensor in = make_input(me, seed, n, dt, values_for(op));
      const Tensor out = in_place ? in : Tensor::empty({n}, dt);
      c.all_reduce(in, out, op).wait();
      check_values(
          out, 0, n, [&](std::int64_t i) { return reduced(op, p, seed, i, dt); },
          op == ReduceOp::avg,
          fmt::format("all_reduce {} in_place={}", reduce_op_name(op), in_place));
    }
  }
}

inline void check_reduce_scatter(Communicator& c, DType dt, std::int64_t n, std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  for (ReduceOp op : kReduceOps) {
    if (!reducible(dt, op)) continue;
    for (bool in_place : {false, true}) {
      const Tensor in = make_input(me, seed, n * p, dt, values_for(op));
      const Tensor out = in_place ? in.narrow(0, me * n, n) : Tensor::empty({n}, dt);
      c.reduce_scatter(in, out, op).wait();
      check_values(
          out, 0, n, [&](std::int64_t i) { return reduced(op, p, seed, me * n + i, dt); },
          op == ReduceOp::avg,
          fmt::format("reduce_scatter {} in_place={}", reduce_op_name(op), in_place));
    }
  }
}

inline void check_reduce(Communicator& c, DType dt, std::int64_t n, std::uint64_t seed) {
  const int me = c.rank(), p = c.size(), root = p / 2;
  for (ReduceOp op : kReduceOps) {
    if (!reducible(dt, op)) continue;
    for (bool in_place : {false, true}) {
      const Tensor in = make_input(me, seed, n, dt, values_for(op));
      const Tensor out = in_place ? in : Tensor::empty({n}, dt);
      c.reduce(in, out, op, root).wait();
      if (me == root) {
        check_values(
            out, 0, n, [&](std::int64_t i) { return reduced(op, p, seed, i, dt); },
            op == ReduceOp::avg,
            fmt::format("reduce {} root {} in_place={}", reduce_op_name(op), root, in_place));
      } else if (!in_place) {
        // in is left alone off the root
        check_values(
            in, 0, n, [&](std::int64_t i) { return gen(me, seed, i, dt, values_for(op)); }, false,
            "reduce input off the root");
      }
    }
  }
}

// all_gather and all_to_all move blocks of n elements; broadcast and all_to_all_v up to full.
inline void check_data_movement(Communicator& c, DType dt, std::int64_t full, std::int64_t n,
                                std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  auto mv = [&](int r, std::int64_t i) { return gen(r, seed, i, dt, Values::move); };
  for (bool in_place : {false, true}) {
    const std::string how = fmt::format(" in_place={}", in_place);
    {  // all_gather
      const Tensor out = Tensor::empty({n * p}, dt);
      Tensor in = make_input(me, seed, n, dt, Values::move);
      if (in_place) {
        out.narrow(0, me * n, n).copy_(in);
        in = out.narrow(0, me * n, n);
      }
      c.all_gather(in, out).wait();
      check_values(
          out, 0, n * p,
          [&](std::int64_t k) {
            return mv(static_cast<int>(k / std::max<std::int64_t>(n, 1)),
                      k % std::max<std::int64_t>(n, 1));
          },
          false, "all_gather" + how);
    }
    {  // all_to_all: block j of rank i's in becomes block i of rank j's out
      const Tensor in = make_input(me, seed, n * p, dt, Values::move);
      const Tensor out = in_place ? in : Tensor::empty({n * p}, dt);
      c.all_to_all(in, out).wait();
      check_values(
          out, 0, n * p,
          [&](std::int64_t k) {
            const std::int64_t j = k / std::max<std::int64_t>(n, 1),
                               i = k % std::max<std::int64_t>(n, 1);
            return mv(static_cast<int>(j), me * n + i);
          },
          false, "all_to_all" + how);
    }
  }
  for (int root : {0, p - 1}) {  // broadcast
    const Tensor t = make_input(me, seed, full, dt, Values::move);
    c.broadcast(t, root).wait();
    check_values(
        t, 0, full, [&](std::int64_t i) { return mv(root, i); }, false,
        fmt::format("broadcast root {}", root));
  }
  {  // all_to_all_v: rank r sends count(r, j) elements to rank j; count 0 happens
    auto count = [&](int r, int j) -> std::int64_t {
      return ((r * 3 + j * 5) % 4) * n / 2;
    };  // 0..1.5 blocks
    std::vector<std::int64_t> sc(p), rc(p);
    for (int j = 0; j < p; ++j) {
      sc[j] = count(me, j);
      rc[j] = count(j, me);
    }
    const std::int64_t ns = std::accumulate(sc.begin(), sc.end(), std::int64_t{0});
    const std::int64_t nr = std::accumulate(rc.begin(), rc.end(), std::int64_t{0});
    const Tensor in = make_input(me, seed, ns, dt, Values::move);
    const Tensor out = Tensor::empty({nr}, dt);
    c.all_to_all_v(in, sc, out, rc).wait();
    std::int64_t at = 0;
    for (int j = 0; j < p; ++j) {
      std::int64_t from = 0;  // where rank j's elements for me start in its input
      for (int k = 0; k < me; ++k) from += count(j, k);
      check_values(
          out.narrow(0, at, rc[j]), 0, rc[j], [&](std::int64_t i) { return mv(j, from + i); },
          false, fmt::format("all_to_all_v from rank {}", j));
      at += rc[j];
    }
  }
}

inline void check_point_to_point(Communicator& c, DType dt, std::int64_t n, std::uint64_t seed) {
  const int me = c.rank(), p = c.size();
  auto mv = [&](int r, std::int64_t i) { return gen(r, seed, i, dt, Values::move); };
  // send/recv in pairs (0,1), (2,3), ...: the lower rank sends first.
  const int partner = me % 2 == 0 ? me + 1 : me - 1;
  if (partner < p) {
    const Tensor mine = make_input(me, seed, n, dt, Values::move);
    const Tensor theirs = Tensor::empty({n}, dt);
    Work first = me % 2 == 0 ? c.send(mine, partner) : c.recv(theirs, partner);
    Work second = me % 2 == 0 ? c.recv(theirs, partner) : c.send(mine, partner);
    second.wait();
    first.wait();
    check_values(
        theirs, 0, n, [&](std::int64_t i) { return mv(partner, i); }, false,
        fmt::format("recv from {}", partner));
  }
  // p2p ring in both directions plus a message to itself, all in one batch.
  const int next = (me + 1) % p, prev = (me + p - 1) % p;
  const Tensor mine = make_input(me, seed, n, dt, Values::move);
  const Tensor from_prev = Tensor::empty({n}, dt), from_next = Tensor::empty({n}, dt),
               from_self = Tensor::empty({n}, dt);
  c.p2p({P2POp::send(mine, next), P2POp::send(mine, prev), P2POp::recv(from_prev, prev),
         P2POp::recv(from_next, next), P2POp::send(mine, me), P2POp::recv(from_self, me)})
      .wait();
  check_values(
      from_prev, 0, n, [&](std::int64_t i) { return mv(prev, i); }, false, "p2p prev");
  check_values(
      from_next, 0, n, [&](std::int64_t i) { return mv(next, i); }, false, "p2p next");
  check_values(
      from_self, 0, n, [&](std::int64_t i) { return mv(me, i); }, false, "p2p self");
}

// Every operation x every dtype x sizes; seed_base separates concurrent groups' inputs.
inline void run_suite(Communicator& c, std::uint64_t seed_base,
                      const std::vector<std::int64_t>& sizes_override = {}) {
  std::uint64_t seed = seed_base;
  for (DType dt : kAllDTypes) {
    for (std::int64_t n : sizes_override.empty() ? test_sizes(dt) : sizes_override) {
      INFO("communicator " << c.name() << " rank " << c.rank() << "/" << c.size() << " dtype "
                           << dtype_name(dt) << " n " << n);
      check_all_reduce(c, dt, n, ++seed);
      check_reduce_scatter(c, dt, block_size(n, c.size()), ++seed);
      check_reduce(c, dt, n, ++seed);
      check_data_movement(c, dt, n, block_size(n, c.size()), ++seed);
      check_point_to_point(c, dt, n, ++seed);
    }
  }
  c.barrier().wait();
}

}  // namespace quintet::test
