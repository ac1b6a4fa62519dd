// --trace: which steps the trainer records with the library's trace recorder, the per-rank
// Chrome trace files it writes, and the straggler line it prints.
//
// Before the first traced step every rank meets at a barrier and reads its host clock
// (clock_sync_us, written into its trace so that scripts/merge_traces.py aligns the ranks); then
// the recorder is started. Each traced step is bracketed by trace::begin_step / end_step (the
// step's GPU ranges are resolved after it, outside its timing). After the last traced step the
// recorder stops, each rank writes DIR/trace_rank<r>.json, and the ranks compare their arrivals
// at the traced collectives (find_stragglers, collective over world).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "quintet/collectives/communicator.hpp"
#include "quintet/parallel/mesh.hpp"
#include "quintet/parallel/overlap/straggler.hpp"

namespace gpt {

class TraceSession {
 public:
  // dir empty, or first > last: nothing is traced (every call is a branch).
  TraceSession(std::string dir, std::int64_t first, std::int64_t last, const quintet::Mesh& mesh,
               quintet::Communicator& world, const quintet::Stream& stream);
  // step: 1-based.
  void before_step(std::int64_t step) {
    if (on_ && step >= first_ && step <= last_) begin(step);
  }
  void after_step(std::int64_t step) {
    if (on_ && step >= first_ && step <= last_) end(step);
  }
  // Rank 0: where the traces went and the straggler line (a JSON object with json).
  void print_report(bool json) const;

 private:
  void begin(std::int64_t step);
  void end(std::int64_t step);

  std::string dir_;
  std::int64_t first_, last_;
  bool on_;
  const quintet::Mesh& mesh_;
  quintet::Communicator& world_;
  const quintet::Stream& stream_;
  double clock_sync_us_ = 0.0;
  std::optional<quintet::overlap::StragglerReport> stragglers_;
  std::int64_t events_ = 0;
};

}  // namespace gpt
