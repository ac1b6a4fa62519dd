#include "quintet/parallel/layout.hpp"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

#include "quintet/core/error.hpp"

namespace quintet {

namespace {

// The five dimensions, in the order their sizes appear in ParallelConfig's comment.
enum Dim { kTp = 0, kCp, kEp, kDp, kPp };
constexpr std::array<std::string_view, 5> kDimNames = {"tp", "cp", "ep", "dp", "pp"};

constexpr std::string_view kOrderHint =
    "write each of the names tp, cp, ep, dp, pp at most once, joined by '-' (the first varies "
    "fastest), e.g. 'tp-cp-ep-dp-pp'";

// Where Megatron-Core's RankGenerator appends the dimensions an order leaves out: in the order of
// its name_to_size table (tp, pp, dp, ep, cp), after the named ones.
constexpr std::array<int, 5> kAppendOrder = {kTp, kPp, kDp, kEp, kCp};

// An order string parsed: position -> dimension, the first `named` positions as written, then the
// dimensions it leaves out, in kAppendOrder.
struct ParsedOrder {
  std::array<int, 5> dims{};
  int named = 0;
};

// Parses an order string; throws with what is wrong with it. Whether the dimensions it leaves out
// have size 1 is checked by check_omitted, which knows the sizes.
ParsedOrder parse_order(std::string_view order) {
  ParsedOrder result;
  std::array<bool, 5> seen{};
  std::size_t start = 0;
  while (true) {
    const std::size_t end = order.find('-', start);
    std::string token(order.substr(start, end == std::string_view::npos ? end : end - start));
    for (char& ch : token) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    int dim = -1;
    for (int d = 0; d < 5; ++d) {
      if (token == kDimNames[d]) dim = d;
    }
    QUINTET_CHECK(dim >= 0, "order '{}' has unknown name '{}'; {}", order, token, kOrderHint);
    QUINTET_CHECK(!seen[dim], "order '{}' names '{}' twice; {}", order, token, kOrderHint);
    seen[dim] = true;
    result.dims[result.named++] = dim;
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  int pos = result.named;
  for (int d : kAppendOrder) {
    if (!seen[d]) result.dims[pos++] = d;
  }
  return result;
}

// The order written out in full: the named dimensions, then the appended ones.
std::string full_order(const ParsedOrder& parsed) {
  std::string out;
  for (int d : parsed.dims) out += fmt::format("{}{}", out.empty() ? "" : "-", kDimNames[d]);
  return out;
}

// A dimension may be left out of the order only when it has size 1 in dense and in expert layers
// (Megatron-Core raises for both of its generators otherwise). Sizes by dimension.
void check_omitted(std::string_view order, const ParsedOrder& parsed,
                   const std::array<std::int64_t, 5>& dense,
                   const std::array<std::int64_t, 5>& expert) {
  for (int pos = parsed.named; pos < 5; ++pos) {
    const int d = parsed.dims[pos];
    std::string found, fix;
    if (dense[d] > 1 && d == kDp) {
      found = fmt::format("dp = world / (tp*cp*pp) = {}", dense[d]);
      fix = "choose tp*cp*pp = world";
    } else if (dense[d] > 1) {
      found = fmt::format("{} = {}", kDimNames[d], dense[d]);
      fix = fmt::format("set {} = 1", kDimNames[d]);
    } else if (expert[d] > 1 && d == kDp) {
      found = fmt::format("edp = world / (etp*ep*pp) = {} (expert layers)", expert[d]);
      fix = "choose etp*ep*pp = world";
    } else if (expert[d] > 1) {  // ep, or etp for tp
      const std::string_view name = d == kTp ? "etp" : kDimNames[d];
      found = fmt::format("{} = {} (expert layers)", name, expert[d]);
      fix = fmt::format("set {} = 1", name);
    } else {
      continue;
    }
    QUINTET_THROW(InvalidArgument,
                  "order '{}' leaves out '{}', but {}: a dimension may be left out of the order "
                  "only when its size is 1 (Megatron-Core appends it then); name '{}' in the "
                  "order where it should vary (e.g. '{}-{}') or {}",
                  order, kDimNames[d], found, kDimNames[d], order, kDimNames[d], fix);
  }
}

// Product of the sizes (by dimension) of the dimensions placed before pp in the order: the
// distance between consecutive stages of one pipeline.
std::int64_t pp_stride(const std::array<int, 5>& order, const std::array<std::int64_t, 5>& size) {
  std::int64_t stride = 1;
  for (int pos = 0; pos < 5 && order[pos] != kPp; ++pos) stride *= size[order[pos]];
  return stride;
}

// Which generator an axis comes from, and which dimensions vary inside one of its groups.
struct AxisSpec {
  std::string_view name;
  bool expert;                 // expert generator (tp = etp, cp = 1) or dense one (ep = 1)
  std::array<bool, 5> varies;  // by dimension
};
constexpr std::array<AxisSpec, kNumAxes> kAxisSpecs = {{
    // tp, cp, ep, dp, pp
    {"tp", false, {true, false, false, false, false}},
    {"cp", false, {false, true, false, false, false}},
    {"ep", true, {false, false, true, false, false}},
    {"dp", false, {false, false, false, true, false}},
    {"pp", false, {false, false, false, false, true}},
    {"etp", true, {true, false, false, false, false}},
    {"edp", true, {false, false, false, true, false}},
    {"tp-cp", false, {true, true, false, false, false}},
    {"dp-cp", false, {false, true, false, true, false}},
    {"tp-dp-cp", false, {true, true, false, true, false}},
    {"mp", false, {true, false, false, false, true}},
    {"etp-ep", true, {true, false, true, false, false}},
    {"embedding", false, {false, false, false, false, true}},  // derived from the pp groups
}};

}  // namespace

std::string_view axis_name(Axis axis) { return kAxisSpecs[static_cast<int>(axis)].name; }

// ---------------------------------------------------------------------------------------------
// ParallelConfig

void ParallelConfig::validate(int world) const {
  QUINTET_CHECK(world >= 1, "the world size must be at least 1 rank, found {}", world);
  const auto at_least_one = [](std::string_view name, int value, std::string_view meaning) {
    QUINTET_CHECK(value >= 1, "{} must be at least 1, found {}: set it to {}", name, value,
                  meaning);
  };
  at_least_one("tp", tp, "the number of ranks that split each layer's tensors (1 for none)");
  at_least_one("cp", cp, "the number of ranks that split the sequence (1 for none)");
  at_least_one("ep", ep, "the number of ranks that share the experts (1 for none)");
  at_least_one("pp", pp, "the number of pipeline stages (1 for none)");
  at_least_one("vpp", vpp, "the number of model chunks per pipeline rank (1 for none)");
  QUINTET_CHECK(etp >= 0, "etp must be at least 1, or 0 for 'same as tp'; found {}", etp);
  QUINTET_CHECK(dp >= 0, "dp must be at least 1, or 0 to infer it from the world size; found {}",
                dp);
  QUINTET_CHECK(
      vpp == 1 || pp > 1,
      "vpp = {} model chunks per rank needs a pipeline, but pp = 1: set pp > 1 or vpp = 1", vpp);
  const ParsedOrder parsed = parse_order(order);

  const std::int64_t tcp = std::int64_t{tp} * cp * pp;
  QUINTET_CHECK(world % tcp == 0,
                "tp*cp*pp = {}*{}*{} = {} does not divide the world size {}: choose tp, cp and pp "
                "whose product divides {} (dp is then world / (tp*cp*pp))",
                tp, cp, pp, tcp, world, world);
  const std::int64_t dense_dp = world / tcp;
  QUINTET_CHECK(dp == 0 || dp == dense_dp,
                "tp*cp*dp*pp = {}*{}*{}*{} = {} is not the world size {}: set dp to {}, or leave "
                "it 0 to infer it",
                tp, cp, dp, pp, tcp * dp, world, dense_dp);

  const int expert_tp = etp == 0 ? tp : etp;
  const std::int64_t etpp = std::int64_t{expert_tp} * ep * pp;
  QUINTET_CHECK(world % etpp == 0,
                "etp*ep*pp = {}*{}*{} = {} does not divide the world size {}: expert layers place "
                "world = etp*ep*edp*pp ranks, so choose ep and etp (default tp) whose product "
                "with pp divides {}",
                expert_tp, ep, pp, etpp, world, world);
  const std::int64_t edp_size = world / etpp;
  check_omitted(order, parsed, {tp, cp, 1, dense_dp, pp}, {expert_tp, 1, ep, edp_size, pp});

  // Dense and expert layers must agree on the pipelines (Megatron-Core asserts the same): the
  // stages of a pipeline are pp_stride ranks apart, the product of the sizes placed before pp.
  if (pp > 1) {
    const std::int64_t dense_stride = pp_stride(parsed.dims, {tp, cp, 1, dense_dp, pp});
    const std::int64_t expert_stride = pp_stride(parsed.dims, {expert_tp, 1, ep, edp_size, pp});
    QUINTET_CHECK(dense_stride == expert_stride,
                  "order '{}' places pipeline stages {} ranks apart for dense layers (tp {}, cp "
                  "{}, dp {}) but {} ranks apart for expert layers (etp {}, ep {}, edp {}), so "
                  "their pipeline groups would differ: put pp last in the order (e.g. "
                  "'tp-cp-ep-dp-pp') or first, or choose sizes whose product before pp is the "
                  "same for both",
                  order, dense_stride, tp, cp, dense_dp, expert_stride, expert_tp, ep, edp_size);
  }
}

ParallelConfig ParallelConfig::resolved(int world) const {
  validate(world);
  ParallelConfig out = *this;
  if (out.etp == 0) out.etp = tp;
  if (out.dp == 0) out.dp = world / (tp * cp * pp);
  out.order = full_order(parse_order(order));
  return out;
}

int ParallelConfig::edp(int world) const {
  validate(world);
  return world / ((etp == 0 ? tp : etp) * ep * pp);
}

// ---------------------------------------------------------------------------------------------
// Megatron-Core's generate_masked_orthogonal_rank_groups.
//
// The world is a grid with one coordinate per dimension, the first varying fastest:
//   rank = sum_i coord_i * stride_i,  stride_i = sizes_0 * ... * sizes_{i-1}.
// A group is the set of ranks whose unmasked coordinates are fixed; inside it the masked
// coordinates run through their range in the same mixed radix (first masked dim fastest), and
// the groups are numbered by the unmasked coordinates in that radix too.
//
// Worked example: world 16, order tp-cp-ep-dp-pp, sizes [tp 2, cp 1, ep 1, dp 4, pp 2], so the
// strides are [1, 2, 2, 2, 8].
//   "tp" (mask tp): 8 groups; group g has unmasked coordinates (cp, ep, dp, pp) =
//     decompose(g, [1, 1, 4, 2]) = (0, 0, g % 4, g / 4), base 2*(g % 4) + 8*(g / 4):
//     [0,1] [2,3] [4,5] [6,7] [8,9] [10,11] [12,13] [14,15].
//   "dp" (mask dp): 4 groups; (tp, cp, ep, pp) = (g % 2, 0, 0, g / 2), base g % 2 + 8*(g / 2),
//     members base + 2*dp: [0,2,4,6] [1,3,5,7] [8,10,12,14] [9,11,13,15].
//   "pp": 8 groups; base g, members g + 8*pp: [0,8] [1,9] ... [7,15].
//   "tp-pp" (mp): 4 groups; masked radix (tp, pp) -> tp + 8*pp, base 2*g:
//     [0,1,8,9] [2,3,10,11] [4,5,12,13] [6,7,14,15].
std::vector<std::vector<int>> orthogonal_rank_groups(int world, const std::vector<int>& sizes,
                                                     const std::vector<bool>& mask) {
  QUINTET_CHECK(sizes.size() == mask.size(),
                "sizes has {} entries but mask has {}; give one "
                "mask entry per dimension",
                sizes.size(), mask.size());
  std::int64_t product = 1;
  for (int s : sizes) {
    QUINTET_CHECK(s >= 1, "every size must be at least 1, found {}", s);
    product *= s;
  }
  QUINTET_CHECK(product == world, "the sizes multiply to {} but the world has {} ranks", product,
                world);

  std::vector<int> masked_shape, masked_stride, unmasked_shape, unmasked_stride;
  int stride = 1;
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(sizes[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(stride);
    stride *= sizes[i];
  }
  int group_size = 1;
  for (int s : masked_shape) group_size *= s;
  const int num_groups = world / group_size;

  // Decomposes index in the mixed radix shape (first fastest) and weighs the digits by stride.
  const auto place = [](int index, const std::vector<int>& shape, const std::vector<int>& strides) {
    int rank = 0;
    for (std::size_t i = 0; i < shape.size(); ++i) {
      rank += (index % shape[i]) * strides[i];
      index /= shape[i];
    }
    return rank;
  };
  std::vector<std::vector<int>> groups(num_groups, std::vector<int>(group_size));
  for (int g = 0; g < num_groups; ++g) {
    const int base = place(g, unmasked_shape, unmasked_stride);
    for (int i = 0; i < group_size; ++i)
      groups[g][i] = base + place(i, masked_shape, masked_stride);
  }
  return groups;
}

// ---------------------------------------------------------------------------------------------
// Layout

Layout::Layout(const ParallelConfig& config, int world)
    : config_(config.resolved(world)), world_(world) {
  order_ = parse_order(config_.order).dims;
  const int edp = world / (config_.etp * config_.ep * config_.pp);
  const std::array<int, 5> dense_by_dim = {config_.tp, config_.cp, 1, config_.dp, config_.pp};
  const std::array<int, 5> expert_by_dim = {config_.etp, 1, config_.ep, edp, config_.pp};
  for (int pos = 0; pos < 5; ++pos) {
    dense_sizes_[pos] = dense_by_dim[order_[pos]];
    expert_sizes_[pos] = expert_by_dim[order_[pos]];
  }

  for (int a = 0; a < kNumAxes; ++a) {
    const AxisSpec& spec = kAxisSpecs[a];
    const std::array<int, 5>& sizes = spec.expert ? expert_sizes_ : dense_sizes_;
    std::vector<bool> mask(5);
    for (int pos = 0; pos < 5; ++pos) mask[pos] = spec.varies[order_[pos]];
    groups_[a] = orthogonal_rank_groups(world, {sizes.begin(), sizes.end()}, mask);
    if (static_cast<Axis>(a) == Axis::embedding) {
      // Megatron-Core's default_embedding_ranks: first and last stage of each pipeline.
      for (auto& g : groups_[a]) {
        if (g.size() > 1) g = {g.front(), g.back()};
      }
    }
    group_index_[a].assign(world, -1);
    index_in_group_[a].assign(world, -1);
    for (std::size_t g = 0; g < groups_[a].size(); ++g) {
      for (std::size_t i = 0; i < groups_[a][g].size(); ++i) {
        group_index_[a][groups_[a][g][i]] = static_cast<int>(g);
        index_in_group_[a][groups_[a][g][i]] = static_cast<int>(i);
      }
    }
  }
}

void Layout::check_rank(int rank) const {
  QUINTET_CHECK(rank >= 0 && rank < world_, "rank {} is outside the world of {} ranks (0..{})",
                rank, world_, world_ - 1);
}

const std::vector<std::vector<int>>& Layout::groups(Axis axis) const {
  return groups_[static_cast<int>(axis)];
}

int Layout::group_size(Axis axis) const {
  return static_cast<int>(groups_[static_cast<int>(axis)].front().size());
}

bool Layout::contains(Axis axis, int rank) const { return group_index(axis, rank) >= 0; }

int Layout::group_index(Axis axis, int rank) const {
  check_rank(rank);
  return group_index_[static_cast<int>(axis)][rank];
}

int Layout::index_in_group(Axis axis, int rank) const {
  check_rank(rank);
  return index_in_group_[static_cast<int>(axis)][rank];
}

const std::vector<int>& Layout::group_of(Axis axis, int rank) const {
  const int g = group_index(axis, rank);
  QUINTET_CHECK(g >= 0,
                "rank {} is in no '{}' group (a middle pipeline stage; embedding groups hold the "
                "first and last stage only): check Layout::contains first",
                rank, axis_name(axis));
  return groups_[static_cast<int>(axis)][g];
}

Coordinates Layout::coordinates(int rank) const {
  check_rank(rank);
  std::array<int, 5> dense{}, expert{};
  for (int pos = 0, d = rank, e = rank; pos < 5; ++pos) {
    dense[order_[pos]] = d % dense_sizes_[pos];
    expert[order_[pos]] = e % expert_sizes_[pos];
    d /= dense_sizes_[pos];
    e /= expert_sizes_[pos];
  }
  return {dense[kTp], dense[kCp], expert[kEp], dense[kDp], dense[kPp], expert[kTp], expert[kDp]};
}

namespace {
// The rank at coord (by dimension) in the grid sizes (by position); names label the dimensions.
int compose(const std::array<int, 5>& order, const std::array<int, 5>& sizes,
            const std::array<int, 5>& coord, const std::array<std::string_view, 5>& names) {
  int rank = 0, stride = 1;
  for (int pos = 0; pos < 5; ++pos) {
    const int c = coord[order[pos]], n = sizes[pos];
    QUINTET_CHECK(c >= 0 && c < n, "coordinate {} = {} is out of range: expected 0..{}",
                  names[order[pos]], c, n - 1);
    rank += c * stride;
    stride *= n;
  }
  return rank;
}
}  // namespace

int Layout::dense_rank(const Coordinates& c) const {
  return compose(order_, dense_sizes_, {c.tp, c.cp, 0, c.dp, c.pp}, kDimNames);
}

int Layout::expert_rank(const Coordinates& c) const {
  return compose(order_, expert_sizes_, {c.etp, 0, c.ep, c.edp, c.pp},
                 {"etp", "cp", "ep", "edp", "pp"});
}

}  // namespace quintet
