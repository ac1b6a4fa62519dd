// The schedule IR: action codes, the checks of Schedule::validate() and the text form.
#include "quintet/parallel/pipeline/schedule.hpp"

#include <fmt/format.h>

#include <array>
#include <cctype>
#include <charconv>
#include <fstream>
#include <sstream>

#include "quintet/core/error.hpp"
#include "schedule_internal.hpp"

namespace quintet::pipeline {

namespace {

constexpr std::array<ActionKind, 8> kAllKinds = {
    ActionKind::forward,       ActionKind::backward,      ActionKind::input_grad,
    ActionKind::weight_grad,   ActionKind::send_forward,  ActionKind::recv_forward,
    ActionKind::send_backward, ActionKind::recv_backward,
};

// Position of every action of one kind in its rank's list, indexed by (stage, microbatch); -1 when
// absent. validate() fills one table per kind.
class Positions {
 public:
  Positions(int stages, int microbatches)
      : microbatches_(microbatches), pos_(kAllKinds.size() * stages * microbatches, -1) {}
  int& at(const Action& a) {
    return pos_[(static_cast<std::size_t>(a.kind) * (pos_.size() / kAllKinds.size())) +
                static_cast<std::size_t>(a.stage) * microbatches_ + a.microbatch];
  }
  int get(ActionKind kind, int stage, int microbatch) {
    return at(Action{kind, stage, microbatch});
  }

 private:
  int microbatches_;
  std::vector<int> pos_;
};

// Fills positions from the lists; each action may appear once.
void index_actions(const Schedule& s, Positions& positions) {
  for (int r = 0; r < s.pp; ++r) {
    const auto& list = s.actions[r];
    for (int i = 0; i < static_cast<int>(list.size()); ++i) {
      const Action& a = list[i];
      QUINTET_CHECK(a.stage >= 0 && a.stage < s.num_stages(),
                    "schedule '{}': rank {} action {} ({}): stage {} is outside 0..{} (pp {} x "
                    "vpp {} stages)",
                    s.name, r, i, a.str(), a.stage, s.num_stages() - 1, s.pp, s.vpp);
      QUINTET_CHECK(a.microbatch >= 0 && a.microbatch < s.microbatches,
                    "schedule '{}': rank {} action {} ({}): microbatch {} is outside 0..{}", s.name,
                    r, i, a.str(), a.microbatch, s.microbatches - 1);
      QUINTET_CHECK(s.stage_rank[a.stage] == r,
                    "schedule '{}': rank {} runs {}, but stage {} is on rank {}; move the action "
                    "to rank {}'s list",
                    s.name, r, a.str(), a.stage, s.stage_rank[a.stage], s.stage_rank[a.stage]);
      int& p = positions.at(a);
      QUINTET_CHECK(p < 0,
                    "schedule '{}': rank {} has {} twice (actions {} and {}); each action "
                    "runs once per step",
                    s.name, r, a.str(), p, i);
      p = i;
    }
  }
}

// Requires action `later` (at position pos_later) to come after `earlier` (pos_earlier) on rank r.
void check_order(const Schedule& s, int r, int pos_earlier, const Action& earlier, int pos_later,
                 const Action& later, const char* why) {
  QUINTET_CHECK(pos_earlier >= 0 && pos_later >= 0 && pos_earlier < pos_later,
                "schedule '{}': on rank {}, {} must come after {} ({}), but {}", s.name, r,
                later.str(), earlier.str(), why,
                pos_earlier < 0 ? fmt::format("{} is missing; add it", earlier.str())
                : pos_later < 0 ? fmt::format("{} is missing; add it", later.str())
                                : fmt::format("it is action {} and {} is action {}", pos_later,
                                              earlier.str(), pos_earlier));
}

}  // namespace

std::string_view action_code(ActionKind kind) {
  switch (kind) {
    case ActionKind::forward:
      return "F";
    case ActionKind::backward:
      return "B";
    case ActionKind::input_grad:
      return "I";
    case ActionKind::weight_grad:
      return "W";
    case ActionKind::send_forward:
      return "SF";
    case ActionKind::recv_forward:
      return "RF";
    case ActionKind::send_backward:
      return "SB";
    case ActionKind::recv_backward:
      return "RB";
  }
  return "?";
}

bool is_compute(ActionKind kind) {
  return kind == ActionKind::forward || kind == ActionKind::backward ||
         kind == ActionKind::input_grad || kind == ActionKind::weight_grad;
}

std::string Action::str() const {
  return fmt::format("{}{}{}", stage, action_code(kind), microbatch);
}

Action Action::parse(std::string_view text) {
  auto fail = [&] {
    QUINTET_THROW(InvalidArgument,
                  "'{}' is not an action: expected <stage><code><microbatch> with code F, B, I, W, "
                  "SF, RF, SB or RB, e.g. 2F0 or 1SB3",
                  text);
  };
  std::size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) ++i;
  std::size_t j = i;
  while (j < text.size() && std::isupper(static_cast<unsigned char>(text[j]))) ++j;
  if (i == 0 || j == i || j == text.size()) fail();
  Action a;
  const std::string_view code = text.substr(i, j - i);
  bool known = false;
  for (ActionKind kind : kAllKinds) {
    if (action_code(kind) == code) {
      a.kind = kind;
      known = true;
    }
  }
  if (!known) fail();
  const std::string_view mb = text.substr(j);
  auto r1 = std::from_chars(text.data(), text.data() + i, a.stage);
  auto r2 = std::from_chars(mb.data(), mb.data() + mb.size(), a.microbatch);
  if (r1.ec != std::errc() || r2.ec != std::errc() || r2.ptr != mb.data() + mb.size()) fail();
  return a;
}

std::string_view schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::gpipe:
      return "gpipe";
    case ScheduleKind::one_f_one_b:
      return "1f1b";
    case ScheduleKind::interleaved:
      return "interleaved";
    case ScheduleKind::zb_h1:
      return "zb-h1";
    case ScheduleKind::zb_v:
      return "zb-v";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(std::string_view name) {
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b,
                            ScheduleKind::interleaved, ScheduleKind::zb_h1, ScheduleKind::zb_v}) {
    if (schedule_kind_name(kind) == name) return kind;
  }
  QUINTET_THROW(InvalidArgument,
                "unknown pipeline schedule '{}': expected gpipe, 1f1b, interleaved, zb-h1 or zb-v",
                name);
}

std::vector<int> Schedule::stages_of(int rank) const {
  std::vector<int> out;
  for (int s = 0; s < static_cast<int>(stage_rank.size()); ++s) {
    if (stage_rank[s] == rank) out.push_back(s);
  }
  return out;
}

bool Schedule::split_backward() const {
  for (const auto& list : actions) {
    for (const Action& a : list) {
      if (a.kind == ActionKind::input_grad || a.kind == ActionKind::weight_grad) return true;
    }
  }
  return false;
}

bool Schedule::remote_boundary(int stage) const {
  return stage >= 0 && stage + 1 < num_stages() && stage_rank[stage] != stage_rank[stage + 1];
}

int Schedule::peer(const Action& transfer) const {
  QUINTET_CHECK(!is_compute(transfer.kind) && transfer.stage >= 0 && transfer.stage < num_stages(),
                "Schedule::peer: {} is not a transfer of one of the {} stages", transfer.str(),
                num_stages());
  const bool to_next =
      transfer.kind == ActionKind::send_forward || transfer.kind == ActionKind::recv_backward;
  const int other = transfer.stage + (to_next ? 1 : -1);
  QUINTET_CHECK(other >= 0 && other < num_stages(),
                "Schedule::peer: {} has no neighbouring stage {} (stages 0..{})", transfer.str(),
                other, num_stages() - 1);
  return stage_rank[other];
}

namespace detail {

bool is_send(ActionKind kind) {
  return kind == ActionKind::send_forward || kind == ActionKind::send_backward;
}

std::string ordinal(int i) {
  const int n = i + 1;
  const char* suffix = (n % 100 >= 11 && n % 100 <= 13) ? "th"
                       : n % 10 == 1                    ? "st"
                       : n % 10 == 2                    ? "nd"
                       : n % 10 == 3                    ? "rd"
                                                        : "th";
  return fmt::format("{}{}", n, suffix);
}

Action matching_transfer(const Action& t) {
  switch (t.kind) {
    case ActionKind::send_forward:
      return {ActionKind::recv_forward, t.stage + 1, t.microbatch};
    case ActionKind::recv_forward:
      return {ActionKind::send_forward, t.stage - 1, t.microbatch};
    case ActionKind::send_backward:
      return {ActionKind::recv_backward, t.stage - 1, t.microbatch};
    case ActionKind::recv_backward:
      return {ActionKind::send_backward, t.stage + 1, t.microbatch};
    default:
      break;
  }
  QUINTET_THROW(InvalidArgument, "matching_transfer: {} is a compute action", t.str());
}

std::optional<Action> input_receive(const Schedule& s, const Action& c) {
  if (c.kind == ActionKind::forward && s.remote_boundary(c.stage - 1)) {
    return Action{ActionKind::recv_forward, c.stage, c.microbatch};
  }
  if ((c.kind == ActionKind::backward || c.kind == ActionKind::input_grad) &&
      s.remote_boundary(c.stage)) {
    return Action{ActionKind::recv_backward, c.stage, c.microbatch};
  }
  return std::nullopt;
}

std::optional<Action> output_send(const Schedule& s, const Action& c) {
  if (c.kind == ActionKind::forward && s.remote_boundary(c.stage)) {
    return Action{ActionKind::send_forward, c.stage, c.microbatch};
  }
  if ((c.kind == ActionKind::backward || c.kind == ActionKind::input_grad) &&
      s.remote_boundary(c.stage - 1)) {
    return Action{ActionKind::send_backward, c.stage, c.microbatch};
  }
  return std::nullopt;
}

void validate_structure(const Schedule& s) {
  QUINTET_CHECK(s.pp >= 1 && s.vpp >= 1 && s.microbatches >= 1,
                "schedule '{}': expected pp, vpp and microbatches >= 1, found pp {}, vpp {}, "
                "microbatches {}",
                s.name, s.pp, s.vpp, s.microbatches);
  QUINTET_CHECK(static_cast<int>(s.stage_rank.size()) == s.num_stages(),
                "schedule '{}': stage_rank has {} entries, expected pp * vpp = {} (one per stage)",
                s.name, s.stage_rank.size(), s.num_stages());
  std::vector<int> held(s.pp, 0);
  for (int st = 0; st < s.num_stages(); ++st) {
    QUINTET_CHECK(s.stage_rank[st] >= 0 && s.stage_rank[st] < s.pp,
                  "schedule '{}': stage {} is placed on rank {}, outside 0..{}", s.name, st,
                  s.stage_rank[st], s.pp - 1);
    ++held[s.stage_rank[st]];
  }
  for (int r = 0; r < s.pp; ++r) {
    QUINTET_CHECK(held[r] == s.vpp,
                  "schedule '{}': rank {} holds {} stages, expected vpp = {} (every rank holds "
                  "the same number of stages)",
                  s.name, r, held[r], s.vpp);
  }
  QUINTET_CHECK(static_cast<int>(s.actions.size()) == s.pp,
                "schedule '{}': {} action lists, expected one per rank (pp = {})", s.name,
                s.actions.size(), s.pp);

  Positions pos(s.num_stages(), s.microbatches);
  index_actions(s, pos);
  const int last = s.num_stages() - 1;
  for (int st = 0; st < s.num_stages(); ++st) {
    const int r = s.stage_rank[st];
    for (int m = 0; m < s.microbatches; ++m) {
      const Action f{ActionKind::forward, st, m};
      const int pf = pos.get(ActionKind::forward, st, m);
      const int pb = pos.get(ActionKind::backward, st, m);
      const int pi = pos.get(ActionKind::input_grad, st, m);
      const int pw = pos.get(ActionKind::weight_grad, st, m);
      QUINTET_CHECK(pf >= 0,
                    "schedule '{}': rank {} never runs {} (every stage forwards every "
                    "microbatch once)",
                    s.name, r, f.str());
      const bool split = pi >= 0 || pw >= 0;
      QUINTET_CHECK(!(split && pb >= 0),
                    "schedule '{}': rank {} runs both {}B{} and {}{}{}; a backward is either one "
                    "B or one I and one W",
                    s.name, r, st, m, st, pi >= 0 ? "I" : "W", m);
      QUINTET_CHECK(split || pb >= 0,
                    "schedule '{}': rank {} never runs the backward of {} (add {}B{}, or {}I{} "
                    "and {}W{})",
                    s.name, r, f.str(), st, m, st, m, st, m);
      QUINTET_CHECK(!split || (pi >= 0 && pw >= 0),
                    "schedule '{}': rank {} runs {}{}{} without its {}{}{}; a split backward "
                    "needs both I and W",
                    s.name, r, st, pi >= 0 ? "I" : "W", m, st, pi >= 0 ? "W" : "I", m);
      const Action back{split ? ActionKind::input_grad : ActionKind::backward, st, m};
      const int pback = split ? pi : pb;
      check_order(s, r, pf, f, pback, back, "a backward needs its forward");
      if (split) {
        check_order(s, r, pi, back, pw, Action{ActionKind::weight_grad, st, m},
                    "W runs after its I");
      }
      // Neighbouring stages on the same rank: the data stays on the rank, in list order.
      if (st > 0 && s.stage_rank[st - 1] == r) {
        check_order(s, r, pos.get(ActionKind::forward, st - 1, m),
                    Action{ActionKind::forward, st - 1, m}, pf, f,
                    "its input is the previous stage's output on this rank");
      }
      if (st < last && s.stage_rank[st + 1] == r) {
        const int pnext = std::max(pos.get(ActionKind::backward, st + 1, m),
                                   pos.get(ActionKind::input_grad, st + 1, m));
        const Action next{pos.get(ActionKind::backward, st + 1, m) >= 0 ? ActionKind::backward
                                                                        : ActionKind::input_grad,
                          st + 1, m};
        check_order(s, r, pnext, next, pback, back,
                    "its output gradient comes from the next stage on this rank");
      }
    }
  }
}

}  // namespace detail

void Schedule::validate() const {
  detail::validate_structure(*this);
  QUINTET_CHECK(!name.empty() && name.find_first_of(" \t\r\n#") == std::string::npos,
                "schedule name '{}': expected one word (no spaces or '#'), so that the text form "
                "reads it back",
                name);
  Positions pos(num_stages(), microbatches);
  index_actions(*this, pos);
  // Transfers exactly where a boundary crosses ranks, each after (send) or before (receive) the
  // compute it serves.
  for (int r = 0; r < pp; ++r) {
    for (const Action& a : actions[r]) {
      if (is_compute(a.kind)) continue;
      const Action m = detail::matching_transfer(a);
      QUINTET_CHECK(
          m.stage >= 0 && m.stage < num_stages() && stage_rank[m.stage] != stage_rank[a.stage],
          "schedule '{}': rank {} has {}, but {}; transfers are only written where "
          "neighbouring stages live on different ranks",
          name, r, a.str(),
          m.stage < 0 || m.stage >= num_stages()
              ? fmt::format("stage {} has no neighbour {}", a.stage, m.stage)
              : fmt::format("stages {} and {} are both on rank {}", a.stage, m.stage, r));
    }
  }
  for (int r = 0; r < pp; ++r) {
    for (const Action& c : actions[r]) {
      if (!is_compute(c.kind)) continue;
      const int pc = pos.at(c);
      if (auto recv = detail::input_receive(*this, c)) {
        check_order(*this, r, pos.at(*recv), *recv, pc, c, "it receives the compute's input");
      }
      if (auto send = detail::output_send(*this, c)) {
        check_order(*this, r, pc, c, pos.at(*send), *send, "it sends the compute's output");
      }
    }
  }
  // Per ordered pair of ranks, a's sends to b, in a's order, are b's receives from a in b's order.
  std::vector<std::vector<std::vector<Action>>> sends(pp, std::vector<std::vector<Action>>(pp));
  std::vector<std::vector<std::vector<Action>>> recvs(pp, std::vector<std::vector<Action>>(pp));
  for (int r = 0; r < pp; ++r) {
    for (const Action& a : actions[r]) {
      if (is_compute(a.kind)) continue;
      if (detail::is_send(a.kind)) {
        sends[r][peer(a)].push_back(a);
      } else {
        recvs[peer(a)][r].push_back(a);
      }
    }
  }
  for (int a = 0; a < pp; ++a) {
    for (int b = 0; b < pp; ++b) {
      const auto& out = sends[a][b];
      const auto& in = recvs[a][b];
      const std::size_t n = std::min(out.size(), in.size());
      for (std::size_t k = 0; k < n; ++k) {
        const Action expected = detail::matching_transfer(out[k]);
        QUINTET_CHECK(in[k] == expected,
                      "schedule '{}': rank {}'s {} send to rank {} is {}, which rank {} receives "
                      "as {}, but rank {}'s {} receive from rank {} is {}; post them in the same "
                      "order on both ranks (messages between two ranks match in order)",
                      name, a, detail::ordinal(static_cast<int>(k)), b, out[k].str(), b,
                      expected.str(), b, detail::ordinal(static_cast<int>(k)), a, in[k].str());
      }
      QUINTET_CHECK(out.size() <= in.size(),
                    "schedule '{}': rank {} sends {} (its {} send to rank {}), but rank {} posts "
                    "only {} receives from rank {}; add {} to rank {}",
                    name, a, out[n].str(), detail::ordinal(static_cast<int>(n)), b, b, in.size(), a,
                    detail::matching_transfer(out[n]).str(), b);
      QUINTET_CHECK(in.size() <= out.size(),
                    "schedule '{}': rank {} receives {} (its {} receive from rank {}), but rank "
                    "{} sends only {} messages to rank {}; add {} to rank {}",
                    name, b, in[n].str(), detail::ordinal(static_cast<int>(n)), a, a, out.size(), b,
                    detail::matching_transfer(in[n]).str(), a);
    }
  }
}

// ---- text form ----

std::string Schedule::str() const {
  std::string out =
      fmt::format("schedule {} pp {} vpp {} microbatches {}\nstages", name, pp, vpp, microbatches);
  for (int r : stage_rank) out += fmt::format(" {}", r);
  out += "\n";
  for (int r = 0; r < static_cast<int>(actions.size()); ++r) {
    out += fmt::format("rank {}:", r);
    for (const Action& a : actions[r]) {
      out += ' ';
      out += a.str();
    }
    out += "\n";
  }
  return out;
}

namespace {

std::vector<std::string_view> split_words(std::string_view line) {
  std::vector<std::string_view> words;
  std::size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && std::isspace(static_cast<unsigned char>(line[i]))) ++i;
    std::size_t j = i;
    while (j < line.size() && !std::isspace(static_cast<unsigned char>(line[j]))) ++j;
    if (j > i) words.push_back(line.substr(i, j - i));
    i = j;
  }
  return words;
}

int parse_int(std::string_view word, const std::string& where, std::string_view what) {
  int value = 0;
  auto r = std::from_chars(word.data(), word.data() + word.size(), value);
  QUINTET_CHECK(r.ec == std::errc() && r.ptr == word.data() + word.size(),
                "{}: expected {} (an integer), found '{}'", where, what, word);
  return value;
}

// The parser behind parse() and load(); origin prefixes every line reference ("" or "path: ").
Schedule parse_text(std::string_view text, const std::string& origin) {
  Schedule s;
  bool have_header = false, have_stages = false;
  int line_no = 0;
  std::size_t begin = 0;
  while (begin < text.size()) {  // a final newline ends the last line, it opens no new one
    std::size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(begin, end - begin);
    begin = end + 1;
    ++line_no;
    const std::string where = fmt::format("{}line {}", origin, line_no);
    const auto words = split_words(line);
    if (words.empty() || words[0][0] == '#') continue;
    const std::string_view key = words[0];
    if (key == "schedule") {
      QUINTET_CHECK(!have_header, "{}: a second 'schedule' line; a file holds one schedule", where);
      QUINTET_CHECK(
          words.size() == 8 && words[2] == "pp" && words[4] == "vpp" && words[6] == "microbatches",
          "{}: expected 'schedule <name> pp <P> vpp <V> microbatches <M>', found '{}'", where,
          line);
      s.name = std::string(words[1]);
      s.pp = parse_int(words[3], where, "pp");
      s.vpp = parse_int(words[5], where, "vpp");
      s.microbatches = parse_int(words[7], where, "microbatches");
      QUINTET_CHECK(s.pp >= 1 && s.vpp >= 1 && s.microbatches >= 1,
                    "{}: expected pp, vpp and microbatches >= 1, found {} {} {}", where, s.pp,
                    s.vpp, s.microbatches);
      have_header = true;
    } else if (key == "stages") {
      QUINTET_CHECK(have_header && !have_stages,
                    "{}: 'stages' must follow the 'schedule' line, once", where);
      QUINTET_CHECK(static_cast<int>(words.size()) == 1 + s.num_stages(),
                    "{}: expected the ranks of {} stages (pp {} x vpp {}), found {}", where,
                    s.num_stages(), s.pp, s.vpp, words.size() - 1);
      for (std::size_t i = 1; i < words.size(); ++i) {
        s.stage_rank.push_back(parse_int(words[i], where, "a rank"));
      }
      have_stages = true;
    } else if (key == "rank") {
      QUINTET_CHECK(have_stages, "{}: a 'rank' line before the 'schedule' and 'stages' lines",
                    where);
      const int expected = static_cast<int>(s.actions.size());
      QUINTET_CHECK(words.size() >= 2 && words[1] == fmt::format("{}:", expected),
                    "{}: expected 'rank {}: <actions>' (ranks in order 0..{}), found '{}'", where,
                    expected, s.pp - 1, line);
      QUINTET_CHECK(expected < s.pp, "{}: rank {} does not exist for pp {}", where, expected, s.pp);
      std::vector<Action> list;
      for (std::size_t i = 2; i < words.size(); ++i) {
        try {
          list.push_back(Action::parse(words[i]));
        } catch (const Error&) {
          QUINTET_THROW(InvalidArgument,
                        "{}: '{}' is not an action: expected <stage><code><microbatch> with code "
                        "F, B, I, W, SF, RF, SB or RB, e.g. 2F0",
                        where, words[i]);
        }
      }
      s.actions.push_back(std::move(list));
    } else {
      QUINTET_THROW(InvalidArgument,
                    "{}: unknown keyword '{}': expected 'schedule', 'stages', 'rank' or a '#' "
                    "comment",
                    where, key);
    }
  }
  const std::string at_end = fmt::format("{}line {} (end of text)", origin, line_no);
  QUINTET_CHECK(have_header, "{}: no 'schedule <name> pp <P> vpp <V> microbatches <M>' line",
                at_end);
  QUINTET_CHECK(have_stages, "{}: no 'stages <rank of stage 0> ...' line", at_end);
  QUINTET_CHECK(static_cast<int>(s.actions.size()) == s.pp,
                "{}: expected a line 'rank {}: <actions>' (pp {} needs ranks 0..{}), found the "
                "end of the text",
                at_end, s.actions.size(), s.pp, s.pp - 1);
  s.validate();
  return s;
}

}  // namespace

Schedule Schedule::parse(std::string_view text) { return parse_text(text, ""); }

Schedule Schedule::load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) QUINTET_THROW(System, "cannot open the schedule file '{}'", path);
  std::ostringstream contents;
  contents << in.rdbuf();
  try {
    return parse_text(contents.str(), path + ": ");
  } catch (const Error& e) {
    // validate()'s messages name the rank and action, not the file: add it.
    const std::string what = e.what();
    if (what.find(path) != std::string::npos) throw;
    throw Error(e.code(), fmt::format("{}: {}", path, what));
  }
}

}  // namespace quintet::pipeline
