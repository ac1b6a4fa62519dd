// Layout over every valid config up to 64 ranks in several orders: each rank is in exactly one
// group per axis, groups have the right sizes, the single axes are orthogonal, coordinates round
// trip, and every group list equals a brute-force grouping computed the other way round (each
// rank's coordinates decomposed, then bucketed by the coordinates a group holds fixed).
// Configs the validator rejects are checked to be exactly those whose dense and expert pipeline
// groups differ.
#include <fmt/format.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "quintet/parallel/layout.hpp"
#include "support/catch.hpp"

using quintet::Axis;
using quintet::Layout;
using quintet::ParallelConfig;
using Groups = std::vector<std::vector<int>>;

namespace {

std::vector<std::string> split_order(const std::string& order) {
  std::vector<std::string> names;
  std::size_t start = 0, end;
  while ((end = order.find('-', start)) != std::string::npos) {
    names.push_back(order.substr(start, end - start));
    start = end + 1;
  }
  names.push_back(order.substr(start));
  return names;
}

// The groups in which only the `varying` names change: every rank's digit per name (first name
// of the order fastest), grouped by the fixed digits, groups ordered by the fixed digits read in
// the same radix, members by the varying digits.
Groups brute_force_groups(int world, const std::vector<std::string>& order,
                          const std::map<std::string, int>& size,
                          const std::vector<std::string>& varying) {
  std::vector<int> sizes;
  std::vector<bool> varies;
  int group_size = 1;
  for (const std::string& name : order) {
    sizes.push_back(size.at(name));
    varies.push_back(false);
    for (const auto& v : varying) {
      if (v == name) varies.back() = true;
    }
    if (varies.back()) group_size *= sizes.back();
  }
  Groups groups(world / group_size, std::vector<int>(group_size, -1));
  for (int r = 0; r < world; ++r) {
    int fixed = 0, fixed_scale = 1, inside = 0, inside_scale = 1, rest = r;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      const int digit = rest % sizes[i];
      rest /= sizes[i];
      if (varies[i]) {
        inside += digit * inside_scale;
        inside_scale *= sizes[i];
      } else {
        fixed += digit * fixed_scale;
        fixed_scale *= sizes[i];
      }
    }
    groups[fixed][inside] = r;
  }
  return groups;
}

struct Expected {
  Axis axis;
  bool expert;
  std::vector<std::string> varying;
  int size;
};

// Returns "" when layout passes every check, else what failed.
std::string check_layout(const Layout& l, const std::vector<std::string>& order) {
  const ParallelConfig& c = l.config();
  const int world = l.world();
  const int edp = world / (c.etp * c.ep * c.pp);
  const std::map<std::string, int> dense = {
      {"tp", c.tp}, {"cp", c.cp}, {"ep", 1}, {"dp", c.dp}, {"pp", c.pp}};
  const std::map<std::string, int> expert = {
      {"tp", c.etp}, {"cp", 1}, {"ep", c.ep}, {"dp", edp}, {"pp", c.pp}};
  if (c.tp * c.cp * c.dp * c.pp != world) return "dense sizes do not multiply to the world";
  const std::vector<Expected> axes = {
      {Axis::tp, false, {"tp"}, c.tp},
      {Axis::cp, false, {"cp"}, c.cp},
      {Axis::dp, false, {"dp"}, c.dp},
      {Axis::pp, false, {"pp"}, c.pp},
      {Axis::ep, true, {"ep"}, c.ep},
      {Axis::etp, true, {"tp"}, c.etp},
      {Axis::edp, true, {"dp"}, edp},
      {Axis::tp_cp, false, {"tp", "cp"}, c.tp * c.cp},
      {Axis::dp_cp, false, {"dp", "cp"}, c.dp * c.cp},
      {Axis::tp_dp_cp, false, {"tp", "dp", "cp"}, c.tp * c.dp * c.cp},
      {Axis::mp, false, {"tp", "pp"}, c.tp * c.pp},
      {Axis::etp_ep, true, {"tp", "ep"}, c.etp * c.ep},
  };
  for (const Expected& e : axes) {
    const std::string name(quintet::axis_name(e.axis));
    const Groups& groups = l.groups(e.axis);
    if (groups != brute_force_groups(world, order, e.expert ? expert : dense, e.varying)) {
      return name + " groups differ from the brute-force grouping";
    }
    if (l.group_size(e.axis) != e.size) return name + " group size";
    std::vector<int> seen(world, 0);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      if (static_cast<int>(groups[g].size()) != e.size) return name + " a group has the wrong size";
      for (std::size_t i = 0; i < groups[g].size(); ++i) {
        const int r = groups[g][i];
        ++seen[r];
        if (l.group_index(e.axis, r) != static_cast<int>(g) ||
            l.index_in_group(e.axis, r) != static_cast<int>(i)) {
          return name + " group_index / index_in_group disagree with the lists";
        }
      }
    }
    for (int r = 0; r < world; ++r) {
      if (seen[r] != 1) return fmt::format("{}: rank {} is in {} groups", name, r, seen[r]);
    }
  }
  // Embedding: the first and last member of each pipeline group (the rank alone for pp == 1).
  const Groups& pp = l.groups(Axis::pp);
  const Groups& emb = l.groups(Axis::embedding);
  if (emb.size() != pp.size()) return "one embedding group per pipeline";
  for (std::size_t g = 0; g < pp.size(); ++g) {
    const std::vector<int> want = c.pp == 1 ? pp[g] : std::vector<int>{pp[g].front(), pp[g].back()};
    if (emb[g] != want) return "embedding group is not first+last stage";
  }
  // Expert layers see the same pipelines.
  if (brute_force_groups(world, order, expert, {"pp"}) != pp) return "expert pp groups differ";

  for (int r = 0; r < world; ++r) {
    const quintet::Coordinates x = l.coordinates(r);
    if (l.dense_rank(x) != r || l.expert_rank(x) != r) return fmt::format("rank {} round trip", r);
    const std::pair<Axis, int> single[] = {{Axis::tp, x.tp},  {Axis::cp, x.cp}, {Axis::dp, x.dp},
                                           {Axis::pp, x.pp},  {Axis::ep, x.ep}, {Axis::etp, x.etp},
                                           {Axis::edp, x.edp}};
    for (const auto& [axis, index] : single) {
      if (l.index_in_group(axis, r) != index) return fmt::format("rank {} coordinate", r);
    }
    if (l.contains(Axis::embedding, r) != (x.pp == 0 || x.pp == c.pp - 1)) {
      return fmt::format("rank {} embedding membership", r);
    }
  }
  // Orthogonality: two different single axes of one family meet in one rank, i.e. no two ranks
  // share both their group on a and their group on b.
  for (const auto& family : {std::vector<Axis>{Axis::tp, Axis::cp, Axis::dp, Axis::pp},
                             std::vector<Axis>{Axis::etp, Axis::ep, Axis::edp, Axis::pp}}) {
    for (Axis a : family) {
      for (Axis b : family) {
        if (a == b) continue;
        const std::size_t nb = l.groups(b).size();
        std::vector<char> met(l.groups(a).size() * nb, 0);
        for (int r = 0; r < world; ++r) {
          char& m = met[l.group_index(a, r) * nb + l.group_index(b, r)];
          if (m)
            return fmt::format("axes {} and {} are not orthogonal", quintet::axis_name(a),
                               quintet::axis_name(b));
          m = 1;
        }
      }
    }
  }
  return "";
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) d.push_back(i);
  }
  return d;
}

}  // namespace

TEST_CASE("layout: every valid config up to 64 ranks, several orders") {
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp", "pp-dp-ep-cp-tp",
                                           "cp-tp-dp-ep-pp"};
  long valid = 0, rejected = 0;
  for (int world = 1; world <= 64; ++world) {
    for (int pp : divisors(world)) {
      for (int tp : divisors(world / pp)) {
        for (int cp : divisors(world / pp / tp)) {
          for (int etp : divisors(world / pp)) {
            for (int ep : divisors(world / pp / etp)) {
              for (const std::string& order : orders) {
                ParallelConfig c;
                c.tp = tp, c.cp = cp, c.ep = ep, c.etp = etp, c.pp = pp, c.order = order;
                const auto names = split_order(order);
                const int dp = world / (tp * cp * pp), edp = world / (etp * ep * pp);
                // Expected to be valid iff dense and expert layers have the same pipelines.
                const bool same_pipelines =
                    brute_force_groups(world, names,
                                       {{"tp", tp}, {"cp", cp}, {"ep", 1}, {"dp", dp}, {"pp", pp}},
                                       {"pp"}) ==
                    brute_force_groups(
                        world, names, {{"tp", etp}, {"cp", 1}, {"ep", ep}, {"dp", edp}, {"pp", pp}},
                        {"pp"});
                INFO(fmt::format("world {} tp {} cp {} ep {} etp {} pp {} order {}", world, tp, cp,
                                 ep, etp, pp, order));
                if (!same_pipelines) {
                  ++rejected;
                  // With pp first or last the stages are 1 or world/pp ranks apart in both.
                  CHECK((order.rfind("pp", 0) != 0 && order.substr(order.size() - 2) != "pp"));
                  REQUIRE_THROWS_QUINTET(Layout(c, world), InvalidArgument,
                                         "pipeline groups would differ");
                  continue;
                }
                ++valid;
                const std::string failure = check_layout(Layout(c, world), names);
                if (!failure.empty()) FAIL(failure);
              }
            }
          }
        }
      }
    }
  }
  INFO(valid << " valid and " << rejected << " rejected configs");
  CHECK(valid > 10000);
  CHECK(rejected > 100);
}
