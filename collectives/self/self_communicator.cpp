// The Self backend: a group of one rank. Every operation is a local copy on the caller's stream
// (none when in and out are the same elements), so Work completes at once and no MPI or NCCL call
// is made. Arguments are validated exactly as the other backends validate them.
#include <cstdint>

#include "collectives/validation.hpp"
#include "quintet/collectives/mpi.hpp"

namespace quintet::detail {

namespace {

class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator(const Device& device, std::string name)
      : device_(device), name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  Backend backend() const override { return Backend::self; }
  Device device() const override { return device_; }
  const std::string& name() const override { return name_; }

  using Communicator::all_reduce;
  Work all_reduce(const Tensor& in, const Tensor& out, ReduceOp op, const Stream& s) override {
    validate_all_reduce(*this, in, out, op);
    copy(in, out, s);  // sum, avg, max, min and prod over one rank are the identity
    return Work();
  }
  Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, const Stream& s) override {
    validate_reduce_scatter(*this, in, out, op);
    copy(in, out, s);
    return Work();
  }
  Work all_gather(const Tensor& in, const Tensor& out, const Stream& s) override {
    validate_all_gather(*this, in, out);
    copy(in, out, s);
    return Work();
  }
  Work broadcast(const Tensor& inout, int root, const Stream&) override {
    validate_broadcast(*this, inout, root);
    return Work();
  }
  Work reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
              const Stream& s) override {
    validate_reduce(*this, in, out, op, root);
    copy(in, out, s);
    return Work();
  }
  Work all_to_all(const Tensor& in, const Tensor& out, const Stream& s) override {
    validate_all_to_all(*this, in, out);
    copy(in, out, s);
    return Work();
  }
  Work all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                    const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                    const Stream& s) override {
    validate_all_to_all_v(*this, in, send_counts, out, recv_counts);
    copy(in, out, s);
    return Work();
  }
  Work send(const Tensor& in, int peer, const Stream&) override {
    validate_send_recv(*this, "send", in, peer);  // always throws: the only peer is this rank
    return Work();
  }
  Work recv(const Tensor& out, int peer, const Stream&) override {
    validate_send_recv(*this, "recv", out, peer);
    return Work();
  }
  Work p2p(const std::vector<P2POp>& ops, const Stream& s) override {
    validate_p2p(*this, ops);  // checks that the k-th send matches the k-th receive in size
    std::vector<const Tensor*> sends, recvs;
    for (const P2POp& op : ops) {
      (op.kind == P2POp::Kind::send ? sends : recvs).push_back(&op.tensor);
    }
    for (std::size_t k = 0; k < sends.size(); ++k) {
      QUINTET_CHECK(sends[k]->dtype() == recvs[k]->dtype(),
                    "p2p on communicator '{}' (self): send {} has dtype {} but the matching "
                    "receive has dtype {}",
                    name_, k, dtype_name(sends[k]->dtype()), dtype_name(recvs[k]->dtype()));
    }
    for (std::size_t k = 0; k < sends.size(); ++k) copy(*sends[k], *recvs[k], s);
    return Work();
  }
  Work barrier(const Stream&) override { return Work(); }

  std::unique_ptr<Communicator> split(int color, int, const std::string& name) override {
    if (color < 0) return nullptr;
    return std::make_unique<SelfCommunicator>(device_, name);
  }

 private:
  // out <- in as flat element sequences of the same size and dtype (validated by the caller).
  static void copy(const Tensor& in, const Tensor& out, const Stream& stream) {
    if (same_elements(in, out) || in.numel() == 0) return;
    Tensor dst = out.view({in.numel()});
    dst.copy_(in.view({in.numel()}), stream);
  }

  Device device_;
  std::string name_;
};

}  // namespace

}  // namespace quintet::detail

namespace quintet {

std::unique_ptr<Communicator> make_self_communicator(const Device& device,
                                                     const std::string& name) {
  return std::make_unique<detail::SelfCommunicator>(device, name);
}

}  // namespace quintet
