// Splits that name their members (Communicator::split(color, key, name, members); issue #44):
// bad members are refused before the backend is asked (before any communication), a result that
// disagrees with them is refused, wrappers pass them on, the Mesh passes each axis's group, and
// split_world_ranks maps them to the world ranks an NCCL split records in the flight recorder.
// One process: the communicator here only splits, as a backend would order the ranks by key.
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "collectives/flight_recorder.hpp"
#include "collectives/split_exchange.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/overlap/timed_communicator.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

// What a split was asked.
struct Asked {
  int color = 0, key = 0;
  std::string name;
  bool with_members = false;
  std::vector<int> members;
};

// A communicator of `size` ranks that can only split. The result of a split is rank `key` of as
// many ranks as the members (child_size without them), or nullptr for color < 0. Every split is
// logged, so a test sees whether the backend was asked at all. plain: a backend that ignores the
// members (Communicator's default split_with_members).
class SplitOnly final : public Communicator {
 public:
  SplitOnly(int rank, int size, std::string name, std::vector<Asked>* log, int child_size = 1,
            bool plain = false)
      : rank_(rank),
        size_(size),
        name_(std::move(name)),
        log_(log),
        child_size_(child_size),
        plain_(plain) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Backend backend() const override { return Backend::self; }
  Device device() const override { return Device::cpu(); }
  const std::string& name() const override { return name_; }

  using Communicator::all_reduce;
  Work all_reduce(const Tensor&, const Tensor&, ReduceOp, const Stream&) override { return none(); }
  Work reduce_scatter(const Tensor&, const Tensor&, ReduceOp, const Stream&) override {
    return none();
  }
  Work all_gather(const Tensor&, const Tensor&, const Stream&) override { return none(); }
  Work broadcast(const Tensor&, int, const Stream&) override { return none(); }
  Work reduce(const Tensor&, const Tensor&, ReduceOp, int, const Stream&) override {
    return none();
  }
  Work all_to_all(const Tensor&, const Tensor&, const Stream&) override { return none(); }
  Work all_to_all_v(const Tensor&, const std::vector<std::int64_t>&, const Tensor&,
                    const std::vector<std::int64_t>&, const Stream&) override {
    return none();
  }
  Work send(const Tensor&, int, const Stream&) override { return none(); }
  Work recv(const Tensor&, int, const Stream&) override { return none(); }
  Work p2p(const std::vector<P2POp>&, const Stream&) override { return none(); }
  Work barrier(const Stream&) override { return none(); }

  using Communicator::split;
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    log_->push_back({color, key, name, false, {}});
    return child(color, key, name, child_size_);
  }

 protected:
  std::unique_ptr<Communicator> split_with_members(int color, int key, const std::string& name,
                                                   const std::vector<int>& members) override {
    if (plain_) return Communicator::split_with_members(color, key, name, members);
    log_->push_back({color, key, name, true, members});
    return child(color, key, name, static_cast<int>(members.size()));
  }

 private:
  static Work none() { throw std::logic_error("SplitOnly only splits"); }
  std::unique_ptr<Communicator> child(int color, int key, const std::string& name, int size) {
    if (color < 0) return nullptr;
    return std::make_unique<SplitOnly>(key, size, name, log_);
  }

  int rank_, size_;
  std::string name_;
  std::vector<Asked>* log_;
  int child_size_;
  bool plain_;
};

}  // namespace

TEST_CASE("bad members are refused before the backend is asked") {
  std::vector<Asked> log;
  SplitOnly world(2, 4, "world", &log);
  REQUIRE_THROWS_QUINTET(world.split(-1, 0, "tp", {2}), InvalidArgument,
                         "in no group (color < 0) but members are given");
  REQUIRE_THROWS_QUINTET(world.split(0, 0, "tp", {}), InvalidArgument,
                         "no members given; give the ranks of 'world' whose color is 0");
  REQUIRE_THROWS_QUINTET(world.split(0, 1, "tp", {2, 4}), InvalidArgument,
                         "member 4 is not a rank of 'world' (0..3)");
  REQUIRE_THROWS_QUINTET(world.split(0, 1, "tp", {-1, 2}), InvalidArgument,
                         "member -1 is not a rank of 'world'");
  REQUIRE_THROWS_QUINTET(world.split(0, 1, "tp", {3, 2, 3}), InvalidArgument,
                         "rank 3 is a member twice");
  REQUIRE_THROWS_QUINTET(world.split(0, 1, "tp", {0, 1}), InvalidArgument,
                         "this rank (2) is not among the members");
  CHECK(log.empty());
}

TEST_CASE("a split whose result disagrees with the members is refused") {
  std::vector<Asked> log;
  SplitOnly world(2, 4, "world", &log);
  // This rank is members[1], but its key (0) makes it rank 0 of the result.
  REQUIRE_THROWS_QUINTET(world.split(0, 0, "dp", {0, 2}), InvalidArgument,
                         "the split gave rank 0 of 2 but the members make this rank 1 of 2");
  REQUIRE(log.size() == 1);
  // Right: the backend gets the members, and the result is theirs.
  auto dp = world.split(0, 1, "dp", {0, 2});
  REQUIRE(dp != nullptr);
  CHECK((dp->rank() == 1 && dp->size() == 2 && dp->name() == "dp"));
  REQUIRE(log.size() == 2);
  CHECK((log[1].with_members && log[1].members == std::vector<int>{0, 2} && log[1].key == 1));
  // No group: nullptr, members empty.
  CHECK(world.split(-1, 0, "embedding", {}) == nullptr);
  CHECK((log.size() == 3 && log[2].with_members && log[2].members.empty()));
}

TEST_CASE("a backend that does not use the members splits as without them") {
  // The default split_with_members: the plain split, still checked against the members.
  std::vector<Asked> log;
  SplitOnly world(1, 3, "world", &log, 3, /*plain=*/true);
  auto all = world.split(0, 1, "all", {0, 1, 2});
  CHECK((all->rank() == 1 && all->size() == 3));
  REQUIRE(log.size() == 1);
  CHECK(!log[0].with_members);
  // The plain split makes a group of 3; members of 2 disagree with it.
  REQUIRE_THROWS_QUINTET(world.split(0, 1, "pair", {0, 1}), InvalidArgument,
                         "the split gave rank 1 of 3 but the members make this rank 1 of 2");
}

TEST_CASE("a timed communicator passes the members on") {
  std::vector<Asked> log;
  SplitOnly world(3, 4, "world", &log);
  overlap::TimedCommunicator timed(world);
  auto sub = timed.split(7, 0, "tp", {3, 1});
  CHECK((sub->rank() == 0 && sub->size() == 2));
  REQUIRE(log.size() == 1);
  CHECK((log[0].with_members && log[0].color == 7 && log[0].members == std::vector<int>{3, 1}));
}

TEST_CASE("the mesh passes each axis's group as the members") {
  // tp 2 x pp 4 on 8 ranks: a middle stage is in no embedding group (no members, color < 0).
  const Layout layout(ParallelConfig{.tp = 2, .pp = 4}, 8);
  for (int me = 0; me < 8; ++me) {
    INFO("rank " << me);
    std::vector<Asked> log;
    SplitOnly world(me, 8, "world", &log);
    const Mesh mesh(layout, world);
    REQUIRE(log.size() == kAllAxes.size());
    for (std::size_t i = 0; i < kAllAxes.size(); ++i) {
      const Axis axis = kAllAxes[i];
      INFO("axis " << axis_name(axis));
      CHECK(log[i].with_members);
      CHECK(log[i].name == axis_name(axis));
      CHECK(log[i].color == layout.group_index(axis, me));
      if (layout.contains(axis, me)) {
        CHECK(log[i].members == layout.group_of(axis, me));
        CHECK(mesh.rank(axis) == layout.index_in_group(axis, me));
      } else {
        CHECK(log[i].members.empty());
        CHECK(!mesh.has(axis));
      }
    }
  }
}

TEST_CASE("split_world_ranks maps the members through the parent's world ranks") {
  using detail::split_world_ranks;
  // A parent of world ranks 4, 6, 8, 10 (itself a split): members 3 and 1 are world ranks 10, 6.
  CHECK(split_world_ranks({4, 6, 8, 10}, {3, 1}) == std::vector<int>{10, 6});
  CHECK(split_world_ranks({0, 1, 2, 3}, {0, 2}) == std::vector<int>{0, 2});
  // A parent that records nothing (world ranks unknown), or no members: none.
  CHECK(split_world_ranks({}, {0, 1}).empty());
  CHECK(split_world_ranks({0, 1}, {}).empty());
  REQUIRE_THROWS_QUINTET(split_world_ranks({4, 6}, {0, 2}), InvalidArgument,
                         "split member 2 is not a rank of the parent's 2");
}

TEST_CASE("split_members: the ranks of this rank's color, by key then rank") {
  using detail::split_members;
  // Ranks 0..4 with (color, key): 1 and 3 share color 7 with keys 5, 2; 0, 2, 4 color 1.
  const std::vector<std::pair<int, int>> ck = {{1, 0}, {7, 5}, {1, 0}, {7, 2}, {1, -3}};
  CHECK(split_members(ck, 1) == std::vector<int>{3, 1});
  CHECK(split_members(ck, 3) == std::vector<int>{3, 1});
  CHECK(split_members(ck, 2) == std::vector<int>{4, 0, 2});  // equal keys: by rank
  CHECK(split_members({{-1, 0}, {0, 0}}, 0).empty());
  REQUIRE_THROWS_QUINTET(split_members(ck, 5), InvalidArgument, "split_members: rank 5 of 5");
}
