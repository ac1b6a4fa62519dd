// The collective-consistency debug mode (see checked_communicator.hpp): every operation's
// fingerprint goes to its peers over a side MPI communicator, and comes back compared, before the
// operation is handed to the inner backend.
#include "quintet/collectives/checked_communicator.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <deque>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/mpi/job_monitor.hpp"
#include "collectives/validation.hpp"
#include "quintet/core/error.hpp"

namespace quintet {

namespace detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int kFingerprintTag = 1;
constexpr std::int64_t kMagic = 0x51434b31;  // "QCK1": a fingerprint, not stray bytes
// A wait polls without sleeping this long (a peer that is about to arrive is seen at once), then
// sleeps between polls, up to kMaxSleep, so that a long wait leaves the core to the ranks.
constexpr std::chrono::microseconds kSpin{500};
constexpr std::chrono::microseconds kMaxSleep{1000};

// checked_operations(): the operations found matching, over every checked communicator.
std::atomic<std::int64_t> g_matched{0};

enum class Kind : std::int64_t {
  all_reduce = 1,
  reduce_scatter,
  all_gather,
  broadcast,
  reduce,
  all_to_all,
  all_to_all_v,
  barrier,
  split,
  send,
  verdict,  // all_to_all_v's second round: whether a rank found a mismatch
};

// One operation as a peer sees it; sent as kWords int64 values.
struct Fingerprint {
  std::int64_t kind = 0;
  // Collectives: the communicator's count of collectives before this one (the same on every
  // rank). send: the count of earlier sends from `from` to `peer`.
  std::int64_t seq = 0;
  std::int64_t dtype = -1;
  std::int64_t count = -1;  // elements per rank (all_to_all_v and send: from `from` to `peer`)
  std::int64_t root = -1;   // broadcast, reduce
  std::int64_t op = -1;     // the reduce op of reductions
  std::int64_t from = -1;   // the rank that sends it
  std::int64_t peer = -1;   // all_to_all_v and send: the rank the count is for; else -1
  std::int64_t magic = kMagic;
  bool operator==(const Fingerprint&) const = default;
};
constexpr int kWords = static_cast<int>(sizeof(Fingerprint) / sizeof(std::int64_t));

bool is_collective(std::int64_t kind) {
  return kind >= static_cast<std::int64_t>(Kind::all_reduce) &&
         kind <= static_cast<std::int64_t>(Kind::split);
}

std::string elements(const Fingerprint& f) {
  if (f.dtype < 0 || f.dtype > static_cast<std::int64_t>(DType::u16)) return "?";
  return fmt::format("{} x {}", f.count, dtype_name(static_cast<DType>(f.dtype)));
}

std::string op_of(const Fingerprint& f) {
  if (f.op < 0 || f.op > static_cast<std::int64_t>(ReduceOp::prod)) return "?";
  return std::string(reduce_op_name(static_cast<ReduceOp>(f.op)));
}

// "all_reduce(sum, 4 x f32)"; as_receiver: the receiving side of a send or all_to_all_v block.
std::string describe(const Fingerprint& f, bool as_receiver = false) {
  if (f.magic != kMagic) return "an operation this check does not know (a corrupt message)";
  switch (static_cast<Kind>(f.kind)) {
    case Kind::all_reduce:
      return fmt::format("all_reduce({}, {})", op_of(f), elements(f));
    case Kind::reduce_scatter:
      return fmt::format("reduce_scatter({}, {} per rank)", op_of(f), elements(f));
    case Kind::all_gather:
      return fmt::format("all_gather({} per rank)", elements(f));
    case Kind::broadcast:
      return fmt::format("broadcast(root {}, {})", f.root, elements(f));
    case Kind::reduce:
      return fmt::format("reduce({}, root {}, {})", op_of(f), f.root, elements(f));
    case Kind::all_to_all:
      return fmt::format("all_to_all({})", elements(f));
    case Kind::all_to_all_v:
      return as_receiver
                 ? fmt::format("all_to_all_v(receiving {} from rank {})", elements(f), f.from)
                 : fmt::format("all_to_all_v(sending {} to rank {})", elements(f), f.peer);
    case Kind::barrier:
      return "barrier";
    case Kind::split:
      return "split";
    case Kind::send:
      return as_receiver ? fmt::format("recv({} from rank {})", elements(f), f.from)
                         : fmt::format("send({} to rank {})", elements(f), f.peer);
    case Kind::verdict:
      return "the second round of all_to_all_v's check";
  }
  return "an operation this check does not know (a corrupt message)";
}

// What the receiving side of one point-to-point transfer knows of it.
struct PeerOp {
  bool send;
  DType dtype;
  std::int64_t count;
  int peer;
};

class CheckedCommunicator final : public Communicator {
 public:
  // Takes ownership of side (a communicator of the same ranks as inner, in the same order, on
  // which nothing else travels).
  CheckedCommunicator(std::unique_ptr<Communicator> inner, MPI_Comm side,
                      const CollectiveCheckOptions& options)
      : inner_(std::move(inner)),
        side_(side),
        options_(options),
        rank_(inner_->rank()),
        size_(inner_->size()),
        sent_to_(static_cast<std::size_t>(size_), 0),
        received_from_(static_cast<std::size_t>(size_), 0) {}

  ~CheckedCommunicator() override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (finalized) return;
    // A fingerprint still in flight (to a rank that is stopped or gone) keeps its buffer and the
    // side communicator, both leaked; so does a failing job, which is aborted, not shut down.
    reclaim_sends();
    if (!sends_.empty() || (options_.monitor != nullptr && options_.monitor->failing())) {
      (void)new std::deque<PendingSend>(std::move(sends_));
      return;
    }
    MPI_Comm_free(&side_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return inner_->backend(); }
  Device device() const override { return inner_->device(); }
  const std::string& name() const override { return inner_->name(); }

  using Communicator::all_reduce;
  Work all_reduce(const Tensor& in, const Tensor& out, ReduceOp op, const Stream& s) override {
    validate_all_reduce(*this, in, out, op);
    check_collective(collective(Kind::all_reduce, in.dtype(), in.numel(), -1, op));
    return inner_->all_reduce(in, out, op, s);
  }
  Work reduce_scatter(const Tensor& in, const Tensor& out, ReduceOp op, const Stream& s) override {
    validate_reduce_scatter(*this, in, out, op);
    check_collective(collective(Kind::reduce_scatter, out.dtype(), out.numel(), -1, op));
    return inner_->reduce_scatter(in, out, op, s);
  }
  Work all_gather(const Tensor& in, const Tensor& out, const Stream& s) override {
    validate_all_gather(*this, in, out);
    check_collective(collective(Kind::all_gather, in.dtype(), in.numel(), -1, std::nullopt));
    return inner_->all_gather(in, out, s);
  }
  Work broadcast(const Tensor& inout, int root, const Stream& s) override {
    validate_broadcast(*this, inout, root);
    check_collective(collective(Kind::broadcast, inout.dtype(), inout.numel(), root, std::nullopt));
    return inner_->broadcast(inout, root, s);
  }
  Work reduce(const Tensor& in, const Tensor& out, ReduceOp op, int root,
              const Stream& s) override {
    validate_reduce(*this, in, out, op, root);
    check_collective(collective(Kind::reduce, in.dtype(), in.numel(), root, op));
    return inner_->reduce(in, out, op, root, s);
  }
  Work all_to_all(const Tensor& in, const Tensor& out, const Stream& s) override {
    validate_all_to_all(*this, in, out);
    check_collective(collective(Kind::all_to_all, in.dtype(), in.numel(), -1, std::nullopt));
    return inner_->all_to_all(in, out, s);
  }
  Work all_to_all_v(const Tensor& in, const std::vector<std::int64_t>& send_counts,
                    const Tensor& out, const std::vector<std::int64_t>& recv_counts,
                    const Stream& s) override {
    validate_all_to_all_v(*this, in, send_counts, out, recv_counts);
    check_collective(collective(Kind::all_to_all_v, in.dtype(), -1, -1, std::nullopt), &send_counts,
                     &recv_counts);
    return inner_->all_to_all_v(in, send_counts, out, recv_counts, s);
  }
  Work send(const Tensor& in, int peer, const Stream& s) override {
    validate_send_recv(*this, "send", in, peer);
    check_p2p({PeerOp{true, in.dtype(), in.numel(), peer}});
    return inner_->send(in, peer, s);
  }
  Work recv(const Tensor& out, int peer, const Stream& s) override {
    validate_send_recv(*this, "recv", out, peer);
    check_p2p({PeerOp{false, out.dtype(), out.numel(), peer}});
    return inner_->recv(out, peer, s);
  }
  Work p2p(const std::vector<P2POp>& ops, const Stream& s) override {
    validate_p2p(*this, ops);
    std::vector<PeerOp> peer_ops;
    peer_ops.reserve(ops.size());
    for (const P2POp& op : ops) {
      peer_ops.push_back(
          {op.kind == P2POp::Kind::send, op.tensor.dtype(), op.tensor.numel(), op.peer});
    }
    check_p2p(peer_ops);
    return inner_->p2p(ops, s);
  }
  Work barrier(const Stream& s) override {
    check_collective(collective(Kind::barrier, std::nullopt, -1, -1, std::nullopt));
    return inner_->barrier(s);
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    return checked_split(color, key, name, nullptr);
  }
  // The inner communicator gets the members (the NCCL backend records with them).
  std::unique_ptr<Communicator> split_with_members(int color, int key, const std::string& name,
                                                   const std::vector<int>& members) override {
    return checked_split(color, key, name, &members);
  }
  std::unique_ptr<Communicator> checked_split(int color, int key, const std::string& name,
                                              const std::vector<int>* members) {
    check_collective(collective(Kind::split, std::nullopt, -1, -1, std::nullopt));
    std::unique_ptr<Communicator> child = members != nullptr
                                              ? inner_->split(color, key, name, *members)
                                              : inner_->split(color, key, name);
    MPI_Comm side = MPI_COMM_NULL;
    QUINTET_MPI_CHECK(MPI_Comm_split(side_, color < 0 ? MPI_UNDEFINED : color, key, &side));
    if (child == nullptr || child->size() == 1) {
      if (side != MPI_COMM_NULL) MPI_Comm_free(&side);
      return child;
    }
    return adopt(std::move(child), side, options_);
  }

  // inner checked over side (owned; freed here on a mismatch of ranks).
  static std::unique_ptr<Communicator> adopt(std::unique_ptr<Communicator> inner, MPI_Comm side,
                                             const CollectiveCheckOptions& options) {
    int rank = 0, size = 0;
    QUINTET_MPI_CHECK(MPI_Comm_set_errhandler(side, MPI_ERRORS_RETURN));
    QUINTET_MPI_CHECK(MPI_Comm_rank(side, &rank));
    QUINTET_MPI_CHECK(MPI_Comm_size(side, &size));
    if (rank != inner->rank() || size != inner->size()) {
      MPI_Comm_free(&side);
      QUINTET_THROW(InvalidArgument,
                    "make_checked_communicator('{}'): the MPI communicator has {} ranks and this "
                    "is its rank {}, but the communicator to check has {} ranks and this is its "
                    "rank {}; pass an MPI communicator of the same ranks in the same order",
                    inner->name(), size, rank, inner->size(), inner->rank());
    }
    return std::make_unique<CheckedCommunicator>(std::move(inner), side, options);
  }

 private:
  struct PendingSend {
    MPI_Request request = MPI_REQUEST_NULL;
    Fingerprint fingerprint;
  };
  enum class WaitEnd { done, timed_out, remote };

  Fingerprint collective(Kind kind, std::optional<DType> dtype, std::int64_t count, int root,
                         std::optional<ReduceOp> op) const {
    Fingerprint f;
    f.kind = static_cast<std::int64_t>(kind);
    f.seq = collective_seq_;
    f.dtype = dtype ? static_cast<std::int64_t>(*dtype) : -1;
    f.count = count;
    f.root = root;
    f.op = op ? static_cast<std::int64_t>(*op) : -1;
    f.from = rank_;
    return f;
  }

  // Throws when an earlier check timed out (the fingerprints in flight no longer pair up).
  void ensure_usable(const Fingerprint& mine) const {
    if (broken_.empty()) return;
    QUINTET_THROW(Aborted,
                  "{} on communicator '{}' was not run: an earlier operation's check failed "
                  "({}); create a new communicator after handling that error",
                  describe(mine), name(), broken_);
  }

  // Gives back the buffers of the fingerprints that have been delivered.
  void reclaim_sends() {
    while (!sends_.empty()) {
      int flag = 0;
      if (MPI_Test(&sends_.front().request, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS || !flag) {
        break;
      }
      sends_.pop_front();
    }
  }

  void post_send(const Fingerprint& f, int peer) {
    PendingSend& p = sends_.emplace_back();  // a deque: earlier elements do not move
    p.fingerprint = f;
    QUINTET_MPI_CHECK(
        MPI_Isend(&p.fingerprint, kWords, MPI_INT64_T, peer, kFingerprintTag, side_, &p.request));
  }

  void post_recv(Fingerprint* into, int peer) {
    recv_requests_.emplace_back();
    QUINTET_MPI_CHECK(
        MPI_Irecv(into, kWords, MPI_INT64_T, peer, kFingerprintTag, side_, &recv_requests_.back()));
  }

  // Waits for every posted receive, until the deadline or the job's failure.
  WaitEnd wait_receives(Clock::time_point t0, Clock::time_point deadline) {
    auto sleep = std::chrono::microseconds(20);
    for (;;) {
      int flag = 0;
      QUINTET_MPI_CHECK(MPI_Testall(static_cast<int>(recv_requests_.size()), recv_requests_.data(),
                                    &flag, MPI_STATUSES_IGNORE));
      if (flag) return WaitEnd::done;
      if (options_.monitor != nullptr && options_.monitor->failed()) return WaitEnd::remote;
      const auto now = Clock::now();
      if (now >= deadline) return WaitEnd::timed_out;
      if (now - t0 < kSpin) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, kMaxSleep);
      }
    }
  }

  // After a wait that did not end: which receives arrived (the others are cancelled), in order.
  std::vector<bool> settle_receives() {
    std::vector<bool> arrived(recv_requests_.size(), false);
    for (std::size_t i = 0; i < recv_requests_.size(); ++i) {
      int flag = 0;
      MPI_Test(&recv_requests_[i], &flag, MPI_STATUS_IGNORE);
      if (flag) {
        arrived[i] = true;
        continue;
      }
      MPI_Cancel(&recv_requests_[i]);
      MPI_Wait(&recv_requests_[i], MPI_STATUS_IGNORE);
    }
    return arrived;
  }

  [[noreturn]] void fail_remote(const std::string& mine) {
    settle_receives();
    broken_ = "another rank failed";
    QUINTET_THROW(Remote, "{} (while rank {} checked {} on communicator '{}')",
                  options_.monitor->remote_error(), rank_, mine, name());
  }

  double timeout_s() const { return options_.timeout_s; }

  Clock::time_point deadline_from(Clock::time_point t0) const {
    return t0 + std::chrono::duration_cast<Clock::duration>(
                    std::chrono::duration<double>(options_.timeout_s));
  }

  // Sends mine to every other rank and compares theirs with it (all_to_all_v: with the counts).
  void check_collective(Fingerprint mine, const std::vector<std::int64_t>* send_counts = nullptr,
                        const std::vector<std::int64_t>* recv_counts = nullptr) {
    ensure_usable(mine);
    ++collective_seq_;
    reclaim_sends();
    const auto t0 = Clock::now();
    exchange(mine, send_counts, recv_counts, t0);
    std::optional<std::size_t> bad;  // index into peers_ of the first rank that differs
    for (std::size_t i = 0; i < peers_.size() && !bad; ++i) {
      if (!(theirs_[i] == expected_[i])) bad = i;
    }
    // What the first round found, kept over all_to_all_v's second round.
    const Fingerprint theirs = bad ? theirs_[*bad] : Fingerprint{};
    const Fingerprint wanted = bad ? expected_[*bad] : Fingerprint{};
    const int bad_rank = bad ? peers_[*bad] : -1;
    if (mine.kind == static_cast<std::int64_t>(Kind::all_to_all_v)) {
      // Ranks i and j can disagree on their counts while a third agrees with both: it learns of
      // the mismatch in a second round, so that no rank enters the exchange alone.
      Fingerprint verdict = mine;
      verdict.kind = static_cast<std::int64_t>(Kind::verdict);
      verdict.count = bad ? 1 : 0;
      verdict.peer = bad ? peers_[*bad] : -1;
      exchange(verdict, nullptr, nullptr, t0);
      if (!bad) {
        for (std::size_t i = 0; i < peers_.size(); ++i) {
          if (theirs_[i].kind == verdict.kind && theirs_[i].seq == verdict.seq &&
              theirs_[i].count == 0) {
            continue;
          }
          QUINTET_THROW(InvalidArgument,
                        "check-collectives: the ranks of communicator '{}' ({} ranks) issued "
                        "all_to_all_v with counts that do not match at seq {}: rank {} found that "
                        "rank {}'s does not match its own (its message says how); rank {} agrees "
                        "with every rank (nothing of this operation was sent)",
                        name(), size_, mine.seq, peers_[i], theirs_[i].peer, rank_);
        }
        g_matched.fetch_add(1, std::memory_order_relaxed);
        return;
      }
    }
    if (!bad) {
      g_matched.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    const bool a2av = mine.kind == static_cast<std::int64_t>(Kind::all_to_all_v);
    const std::string seq_note = is_collective(theirs.kind) && theirs.seq != mine.seq
                                     ? fmt::format(" (its seq {})", theirs.seq)
                                     : std::string();
    QUINTET_THROW(InvalidArgument,
                  "check-collectives: the ranks of communicator '{}' ({} ranks) issued different "
                  "operations at seq {}: rank {} issued {}, rank {} issued {}{}; every rank must "
                  "issue the same collectives, with the same dtype, count, reduce op and root, in "
                  "the same order (nothing of this operation was sent)",
                  name(), size_, mine.seq, rank_, describe(a2av ? wanted : mine, a2av), bad_rank,
                  describe(theirs), seq_note);
  }

  // One round: f (or, for all_to_all_v, f with each peer's count) to every other rank; theirs_
  // gets theirs, expected_ what each should be. Throws Timeout naming the ranks that did not
  // arrive, or Remote when the job fails meanwhile.
  void exchange(const Fingerprint& f, const std::vector<std::int64_t>* send_counts,
                const std::vector<std::int64_t>* recv_counts, Clock::time_point t0) {
    const std::size_t others = static_cast<std::size_t>(size_ - 1);
    peers_.resize(others);
    theirs_.assign(others, Fingerprint{});
    expected_.assign(others, f);
    recv_requests_.clear();
    for (std::size_t i = 0; i < others; ++i) {
      const int peer = static_cast<int>(i) < rank_ ? static_cast<int>(i) : static_cast<int>(i) + 1;
      peers_[i] = peer;
      expected_[i].from = peer;
      if (recv_counts != nullptr) {
        expected_[i].count = (*recv_counts)[static_cast<std::size_t>(peer)];
        expected_[i].peer = rank_;
      }
      post_recv(&theirs_[i], peer);
    }
    for (std::size_t i = 0; i < others; ++i) {
      Fingerprint out = f;
      if (send_counts != nullptr) {
        out.count = (*send_counts)[static_cast<std::size_t>(peers_[i])];
        out.peer = peers_[i];
      }
      post_send(out, peers_[i]);
    }
    const WaitEnd end = wait_receives(t0, deadline_from(t0));
    if (end == WaitEnd::done) return;
    const std::string mine = describe(f);
    if (end == WaitEnd::remote) fail_remote(mine);
    const std::vector<bool> arrived = settle_receives();
    std::vector<int> missing;
    for (std::size_t i = 0; i < others; ++i) {
      if (!arrived[i]) missing.push_back(peers_[i]);
    }
    std::string nor;  // " (nor did ranks 2, 3)"
    for (std::size_t k = 1; k < missing.size(); ++k) {
      nor += k == 1 ? (missing.size() > 2 ? " (nor did ranks " : " (nor did rank ") : ", ";
      nor += std::to_string(missing[k]);
    }
    if (!nor.empty()) nor += ")";
    const int first = missing.empty() ? -1 : missing.front();
    broken_ = fmt::format("rank {} never reached seq {} on '{}'", first, f.seq, name());
    QUINTET_THROW(Timeout,
                  "check-collectives: rank {} never reached seq {} on '{}'{}: rank {} issued {} "
                  "there and waited {} s for the other ranks' fingerprints; rank {} skipped this "
                  "operation (or issued it on another communicator), or is stopped, or is slower "
                  "than --timeout-s (QUINTET_TIMEOUT_S)",
                  first, f.seq, name(), nor, rank_, mine, timeout_s(), first);
  }

  // Sends go out with their fingerprints at once; receives compare theirs with the sender's.
  void check_p2p(const std::vector<PeerOp>& ops) {
    if (!ops.empty()) ensure_usable(p2p_fingerprint(ops.front()));
    reclaim_sends();
    const auto t0 = Clock::now();
    std::size_t receives = 0;
    for (const PeerOp& op : ops) receives += op.send ? 0 : 1;
    theirs_.assign(receives, Fingerprint{});
    expected_.clear();
    peers_.clear();
    recv_requests_.clear();
    for (const PeerOp& op : ops) {  // receives first, so that the peers' sends find them posted
      if (op.send) continue;
      expected_.push_back(p2p_fingerprint(op));
      ++received_from_[static_cast<std::size_t>(op.peer)];
      peers_.push_back(op.peer);
      post_recv(&theirs_[peers_.size() - 1], op.peer);
    }
    for (const PeerOp& op : ops) {
      if (!op.send) continue;
      post_send(p2p_fingerprint(op), op.peer);
      ++sent_to_[static_cast<std::size_t>(op.peer)];
    }
    if (receives == 0) return;
    const WaitEnd end = wait_receives(t0, deadline_from(t0));
    if (end == WaitEnd::remote) fail_remote(describe(expected_.front(), true));
    if (end == WaitEnd::timed_out) {
      const std::vector<bool> arrived = settle_receives();
      std::size_t i = 0;
      while (i < arrived.size() && arrived[i]) ++i;
      const Fingerprint& wanted = expected_[std::min(i, expected_.size() - 1)];
      broken_ = fmt::format("rank {} never reached send #{} to rank {} on '{}'", wanted.from,
                            wanted.seq, rank_, name());
      QUINTET_THROW(Timeout,
                    "check-collectives: rank {} never reached send #{} to rank {} on '{}': rank "
                    "{} issued {} and waited {} s for its fingerprint; rank {} skipped the "
                    "matching send (or issued it on another communicator), or is stopped, or is "
                    "slower than --timeout-s (QUINTET_TIMEOUT_S)",
                    wanted.from, wanted.seq, rank_, name(), rank_, describe(wanted, true),
                    timeout_s(), wanted.from);
    }
    for (std::size_t i = 0; i < expected_.size(); ++i) {
      if (theirs_[i] == expected_[i]) continue;
      const std::string what = theirs_[i].kind == static_cast<std::int64_t>(Kind::send)
                                   ? fmt::format("its send #{} to rank {}", theirs_[i].seq, rank_)
                                   : "there";
      QUINTET_THROW(InvalidArgument,
                    "check-collectives: a send and its receive do not match on communicator "
                    "'{}' ({} ranks): rank {} issued {} (its receive #{} from rank {}), rank {} "
                    "issued {} ({}); a send and its receive must have the same dtype and count, "
                    "and be issued in the same order relative to the collectives (nothing of "
                    "this receive was received)",
                    name(), size_, rank_, describe(expected_[i], true), expected_[i].seq,
                    expected_[i].from, expected_[i].from, describe(theirs_[i]), what);
    }
    g_matched.fetch_add(static_cast<std::int64_t>(receives), std::memory_order_relaxed);
  }

  // The fingerprint of a send (from this rank), or the one a receive expects from its peer, at
  // the pair's current count of transfers (which the caller advances).
  Fingerprint p2p_fingerprint(const PeerOp& op) const {
    Fingerprint f;
    f.kind = static_cast<std::int64_t>(Kind::send);
    f.dtype = static_cast<std::int64_t>(op.dtype);
    f.count = op.count;
    const auto p = static_cast<std::size_t>(op.peer);
    f.seq = op.send ? sent_to_[p] : received_from_[p];
    f.from = op.send ? rank_ : op.peer;
    f.peer = op.send ? op.peer : rank_;
    return f;
  }

  std::unique_ptr<Communicator> inner_;
  MPI_Comm side_;
  CollectiveCheckOptions options_;
  int rank_;
  int size_;
  std::int64_t collective_seq_ = 0;
  std::vector<std::int64_t> sent_to_;        // sends to each rank so far
  std::vector<std::int64_t> received_from_;  // receives from each rank so far
  std::string broken_;  // why the fingerprints no longer pair up (empty while they do)
  // The round in progress (kept to reuse their memory).
  std::vector<int> peers_;
  std::vector<Fingerprint> theirs_;
  std::vector<Fingerprint> expected_;
  std::vector<MPI_Request> recv_requests_;
  std::deque<PendingSend> sends_;  // fingerprints not yet delivered, oldest first
};

}  // namespace

}  // namespace detail

std::unique_ptr<Communicator> make_checked_communicator(std::unique_ptr<Communicator> inner,
                                                        MPI_Comm ranks,
                                                        const CollectiveCheckOptions& options) {
  QUINTET_CHECK(inner != nullptr, "make_checked_communicator: no communicator to check");
  QUINTET_CHECK(options.timeout_s > 0,
                "make_checked_communicator('{}'): CollectiveCheckOptions::timeout_s is {}; "
                "expected a positive number of seconds",
                inner->name(), options.timeout_s);
  if (inner->size() == 1) return inner;
  // (A communicator of more than one rank exists, so MPI runs with MPI_THREAD_MULTIPLE, unless it
  // is an NCCL one of a job launched without MPI.)
  int finalized = 1;
  QUINTET_MPI_CHECK(MPI_Finalized(&finalized));
  int initialized = 0;
  QUINTET_MPI_CHECK(MPI_Initialized(&initialized));
  QUINTET_CHECK(initialized && !finalized,
                "make_checked_communicator('{}'): its fingerprints travel over MPI, which is not "
                "running; launch with mpirun and call quintet::init() first",
                inner->name());
  QUINTET_CHECK(ranks != MPI_COMM_NULL, "make_checked_communicator('{}'): ranks is MPI_COMM_NULL",
                inner->name());
  MPI_Comm side = MPI_COMM_NULL;
  QUINTET_MPI_CHECK(MPI_Comm_dup(ranks, &side));
  return detail::CheckedCommunicator::adopt(std::move(inner), side, options);
}

bool checks_collectives(const Communicator& comm) {
  return dynamic_cast<const detail::CheckedCommunicator*>(&comm) != nullptr;
}

std::int64_t checked_operations() { return detail::g_matched.load(std::memory_order_relaxed); }

}  // namespace quintet
