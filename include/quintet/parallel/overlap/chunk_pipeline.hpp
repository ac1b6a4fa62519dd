// ChunkPipeline: the schedule of a computation cut into chunks so that communication and compute
// overlap (parallel/overlap/chunk_pipeline.cpp). A layer says what one chunk does in up to three
// stages and the pipeline orders them:
//
//   bring(c)    starts the communication that brings chunk c's input (an all-gather piece, the
//               rows an all-to-all dispatches); issued `lookahead` chunks ahead of compute(c),
//               so it travels while the chunks before it compute
//   compute(c)  chunk c's compute, on the stream, after the stream waited for bring(c)
//   send(c)     starts the communication that takes chunk c's result away (a reduce-scatter or
//               all-reduce piece, the rows returned to their tokens' ranks), issued right after
//               compute(c), so it travels under compute(c + 1) and whatever the caller runs next
//
// Every stage is optional. bring and send return the Work of what they started (a default Work
// when there is nothing to wait for); the stream waits for bring(c)'s Work before compute(c).
// send's Works are held by the returned SentChunks until finish(), which makes the stream wait
// for each in chunk order and then runs arrived(c) (placing chunk c's result): call it once the
// compute that may overlap the last chunks' sends (a weight gradient) has been queued.
//
//   // all-gather then GEMM: chunk c + 1's gather runs while chunk c's GEMM does
//   ChunkPipeline::run(k, {.bring = [&](int c) { return tp.all_gather(in[c], got[c], s); },
//                          .compute = [&](int c) { y[c] = gemm(got[c]); }}, s);
//   // GEMM then reduce-scatter, finished after the weight gradient
//   SentChunks out = ChunkPipeline::run(k, {.compute = ..., .send = ..., .arrived = ...}, s);
//   weight_gradient();
//   out.finish(s);
//
// Streams: every stage is queued on `stream` (the caller's compute stream); communicators order
// their work after what is already queued there (communicator.hpp), so bring(c + 1) issued before
// compute(c) depends only on work queued before it. On the CPU the communicator's thread runs the
// communication while the calling thread computes. Lookahead 0 means every chunk's bring is
// issued before the first compute (the most overlap; every chunk's buffer is live at once).
// Ranks must run the same chunks in the same order. Not thread-safe.
#pragma once

#include <functional>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"

namespace quintet::overlap {

// The communications of a pipeline's send stage still in flight, with what to do when each has
// arrived. Move-only; finish() must be called (the destructor does not wait).
class SentChunks {
 public:
  SentChunks() = default;
  SentChunks(SentChunks&&) = default;
  SentChunks& operator=(SentChunks&&) = default;
  SentChunks(const SentChunks&) = delete;
  SentChunks& operator=(const SentChunks&) = delete;

  // Holds w (chunk's send) and arrived, run with finish()'s stream after it waited for w.
  void add(int chunk, Work w, std::function<void(int, const Stream&)> arrived);
  // Makes stream wait for every held Work in the order added, running each arrived() after its
  // wait; then holds nothing.
  void finish(const Stream& stream);
  bool empty() const { return works_.empty(); }

 private:
  struct Entry {
    int chunk;
    Work work;
    std::function<void(int, const Stream&)> arrived;
  };
  std::vector<Entry> works_;
};

struct ChunkStages {
  std::function<Work(int)> bring;    // optional: starts chunk c's incoming communication
  std::function<void(int)> compute;  // chunk c's compute (required)
  std::function<Work(int)> send;     // optional: starts chunk c's outgoing communication
  std::function<void(int, const Stream&)> arrived;  // optional: after chunk c's send, on
                                                    // the stream finish() was given
  int lookahead = 1;  // brings issued ahead of compute; 0: all of them first
};

class ChunkPipeline {
 public:
  // Runs chunks 0..chunks-1 through stages on stream (see the header comment); returns the sends
  // still in flight. Throws InvalidArgument for chunks < 1, lookahead < 0 or no compute stage,
  // before any stage runs.
  static SentChunks run(int chunks, const ChunkStages& stages, const Stream& stream);
};

}  // namespace quintet::overlap
