// Pipeline schedules as data (docs/architecture.md): for each pipeline rank, the ordered list of
// actions it runs in one training step, made by pure generators or written by hand, checked before
// anything runs, and printed and parsed in a compact text form. Implemented by
// parallel/pipeline/schedule.cpp (the IR, its text form and its checks) and
// parallel/pipeline/generators.cpp (make_schedule).
//
// Stages. The model is cut into pp * vpp stages (model chunks;
// quintet/parallel/model/chunk_spec.hpp cuts it), stage 0 holding the embedding and stage pp*vpp -
// 1 the head and loss. stage_rank[s] is the pipeline rank (index in the pp group) that holds stage
// s; every rank holds vpp stages. Interleaved schedules place stage s on rank s % pp (Megatron's
// virtual pipeline); ZB-V places stages r and 2pp - 1 - r on rank r (a V).
//
// Actions, each for one (stage, microbatch); text form <stage><code><microbatch>, e.g. "2F0":
//   F  forward of the stage                       B  its full backward (input and weight grads)
//   I  the input-gradient half of B               W  the weight-gradient half of B (after its I)
//   SF send the stage's output activation to the rank of stage + 1
//   RF receive the stage's input activation from the rank of stage - 1
//   SB send d(the stage's input) to the rank of stage - 1
//   RB receive d(the stage's output) from the rank of stage + 1
// Between two stages on the same rank (the bottom of a V) no send or receive is written: the
// activation and its gradient stay on the rank.
//
// How an executor runs it (and the simulator models it): a rank runs its compute actions in
// order on its compute stream. Each maximal run of consecutive SF/RF/SB/RB actions in its list is
// one batched point-to-point operation (Communicator::p2p), issued when the compute before it has
// been issued, without waiting; batches of a rank run one after another on its communicator
// (stream or progress thread). A batch starts once the batch before it has completed and the
// compute before it in the list has finished (the comm stream waits on an event recorded after
// that compute, docs/architecture.md §3), and it completes only once every peer batch that holds a
// matching operation has started (transports match a send with a receive only when both are
// posted). A compute action that needs a received tensor waits for the batch of its receive, and
// for nothing else. Messages between two ranks are matched in the order they are posted, so the
// sends from rank a to rank b, in a's order, must be exactly the receives b posts from a, in b's
// order.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace quintet::pipeline {

enum class ActionKind : std::uint8_t {
  forward,        // F
  backward,       // B
  input_grad,     // I
  weight_grad,    // W
  send_forward,   // SF
  recv_forward,   // RF
  send_backward,  // SB
  recv_backward,  // RB
};
// "F", "B", "I", "W", "SF", "RF", "SB", "RB".
std::string_view action_code(ActionKind kind);
// F, B, I, W (compute) or one of the four transfers.
bool is_compute(ActionKind kind);

struct Action {
  ActionKind kind = ActionKind::forward;
  int stage = 0;       // global stage index, 0 .. pp*vpp - 1
  int microbatch = 0;  // 0 .. microbatches - 1
  bool operator==(const Action&) const = default;
  // "2F0".
  std::string str() const;
  // Parses str()'s form; throws InvalidArgument naming the text otherwise.
  static Action parse(std::string_view text);
};

// The generators' schedules.
enum class ScheduleKind {
  gpipe,        // all forwards, then all backwards
  one_f_one_b,  // 1F1B: warm-up forwards, then one forward one backward, then cool-down
  interleaved,  // interleaved 1F1B over vpp >= 2 chunks per rank (Megatron)
  zb_h1,        // zero-bubble H1: 1F1B with B split into I and W, W deferred into the bubble
  zb_v,         // zero-bubble V: two chunks per rank in V order, B split into I and W
};
// "gpipe", "1f1b", "interleaved", "zb-h1", "zb-v".
std::string_view schedule_kind_name(ScheduleKind kind);
// Parses those names; throws InvalidArgument listing them otherwise.
ScheduleKind parse_schedule_kind(std::string_view name);

struct Schedule {
  std::string name;  // the generator's name, or the file's
  int pp = 1;
  int vpp = 1;
  int microbatches = 1;
  std::vector<int> stage_rank;               // [pp * vpp]: the rank holding each stage
  std::vector<std::vector<Action>> actions;  // [pp]: each rank's actions, in order

  int num_stages() const { return pp * vpp; }
  // The stages rank holds, in increasing order.
  std::vector<int> stages_of(int rank) const;
  // Whether backward is split into I and W (any I or W action appears).
  bool split_backward() const;
  // Whether the boundary between stage and stage + 1 crosses ranks, so that the activation is sent
  // (SF / RF) and its gradient sent back (SB / RB); false past the last stage.
  bool remote_boundary(int stage) const;
  // The rank a transfer goes to (SF, SB) or comes from (RF, RB): the rank of stage + 1 for SF and
  // RB, of stage - 1 for RF and SB. Throws InvalidArgument for a compute action.
  int peer(const Action& transfer) const;

  // Throws InvalidArgument, naming the rank and the action, unless the schedule is well formed:
  // sizes consistent (pp, vpp, microbatches >= 1; stage_rank a placement of vpp stages on each
  // rank); every action on the rank that holds its stage; each (stage, microbatch) forwarded
  // exactly once and backwarded exactly once (one B, or one I and one W, never both forms), its F
  // before its B or I, its W after its I, on that rank; between two stages on the same rank, F of
  // the lower stage before F of the higher and the backward (B or I) of the higher before that of
  // the lower; its RF before its F and its RB before its B or I; its SF after its F and its SB
  // after its B or I (a send carries what that compute made); a send and a receive exactly where
  // a neighbouring stage lives on another rank, never between stages on the same rank; for every
  // pair of ranks, the sends of one in order equal the receives of the other in order; and a name
  // of one word (no spaces, no '#'), so the text form reads it back. Deadlock freedom is the
  // simulator's (simulator.hpp).
  void validate() const;

  // The text form, which parse() reads back to an equal schedule:
  //   # comment lines and blank lines are ignored
  //   schedule <name> pp <P> vpp <V> microbatches <M>
  //   stages <rank of stage 0> <rank of stage 1> ...
  //   rank 0: 0F0 0SF0 0F1 ...
  //   rank 1: ...
  std::string str() const;
  // Parses the text form and validates the result; a malformed line is an InvalidArgument naming
  // its line number ("line 4: ..."; a missing rank line names the end of the text).
  static Schedule parse(std::string_view text);
  // parse() of a file's contents; the error names the path (System when it cannot be read).
  static Schedule load(const std::string& path);

  bool operator==(const Schedule&) const = default;
};

// The cost of each action, for the simulator (simulator.hpp) and for the generators, which plan
// the transfers for them. Time units are the caller's (milliseconds, or 1 for unit costs).
// backward is the full backward (B); a split schedule runs I for backward - weight_grad and W for
// weight_grad.
struct ActionCosts {
  double forward = 1.0;
  double backward = 2.0;
  double weight_grad = 1.0;  // the W part of backward; 0 <= weight_grad <= backward
  double p2p = 0.0;          // latency of one batched transfer, from both sides posted to done
};

// The schedule of kind for pp ranks, vpp stages per rank and that many microbatches: a pure
// function of its arguments, validated, and deadlock-free under the simulator's model whatever the
// costs it later runs at. costs are what it is planned for: each receive is posted where, at those
// costs, its message is sent (early, yet never holding up the sends queued behind it); zb-v's
// greedy order is built at them; zb-h1 is the fixed zero-bubble H1 pattern (rank r defers r W's),
// or, when one finishes sooner at these costs, a greedy order under the same peak memory (at most
// pp microbatches in flight on a rank, 1F1B's first-stage peak), since the pattern assumes F, I and
// W of about one length. The defaults suit B = 2 F, W = F; pass measured costs to plan for them.
// Throws InvalidArgument, stating the rule, when the combination is not valid: gpipe, 1f1b and
// zb-h1 take vpp = 1; zb-v takes vpp = 2; interleaved takes vpp >= 2 and microbatches a multiple of
// pp (Megatron-Core's microbatch-group rule with its default group of pp microbatches per chunk);
// zb-h1 and zb-v need microbatches >= pp.
Schedule make_schedule(ScheduleKind kind, int pp, int vpp, int microbatches,
                       const ActionCosts& costs = {});

}  // namespace quintet::pipeline
