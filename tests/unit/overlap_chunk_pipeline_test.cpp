// ChunkPipeline: the order in which it issues each chunk's stages (logged by the stages
// themselves, against the order written out by hand for each lookahead), that finish() runs the
// arrivals in chunk order after all computes, and that bad arguments throw before any stage runs.
#include <string>
#include <vector>

#include "quintet/parallel/overlap/chunk_pipeline.hpp"
#include "support/catch.hpp"

using namespace quintet;

namespace {

struct Log {
  std::vector<std::string> events;
  overlap::ChunkStages stages(bool bring, bool send, int lookahead) {
    overlap::ChunkStages s;
    s.lookahead = lookahead;
    if (bring) s.bring = [this](int c) { return note("b", c); };
    s.compute = [this](int c) { note("c", c); };
    if (send) {
      s.send = [this](int c) { return note("s", c); };
      s.arrived = [this](int c, const Stream&) { note("a", c); };
    }
    return s;
  }
  Work note(const char* what, int c) {
    events.push_back(what + std::to_string(c));
    return Work();
  }
  std::string str() const {
    std::string out;
    for (const std::string& e : events) out += (out.empty() ? "" : " ") + e;
    return out;
  }
};

}  // namespace

TEST_CASE("ChunkPipeline issues brings ahead of computes and sends right after them") {
  const Stream cpu;
  SECTION("lookahead 1: chunk c + 1 travels while chunk c computes") {
    Log log;
    overlap::SentChunks sent = overlap::ChunkPipeline::run(3, log.stages(true, true, 1), cpu);
    CHECK(log.str() == "b0 b1 c0 s0 b2 c1 s1 c2 s2");
    REQUIRE_FALSE(sent.empty());
    sent.finish(cpu);
    CHECK(log.str() == "b0 b1 c0 s0 b2 c1 s1 c2 s2 a0 a1 a2");
    CHECK(sent.empty());
  }
  SECTION("lookahead 0: every bring first") {
    Log log;
    overlap::ChunkPipeline::run(4, log.stages(true, false, 0), cpu).finish(cpu);
    CHECK(log.str() == "b0 b1 b2 b3 c0 c1 c2 c3");
  }
  SECTION("lookahead 2 and a single chunk") {
    Log log;
    overlap::ChunkPipeline::run(4, log.stages(true, false, 2), cpu).finish(cpu);
    CHECK(log.str() == "b0 b1 b2 c0 b3 c1 c2 c3");
    Log one;
    overlap::ChunkPipeline::run(1, one.stages(true, true, 1), cpu).finish(cpu);
    CHECK(one.str() == "b0 c0 s0 a0");
  }
  SECTION("compute then send only: the caller's work runs before the arrivals") {
    Log log;
    overlap::SentChunks sent = overlap::ChunkPipeline::run(2, log.stages(false, true, 1), cpu);
    log.note("w", 0);  // a weight gradient queued between the sends and finish()
    sent.finish(cpu);
    CHECK(log.str() == "c0 s0 c1 s1 w0 a0 a1");
  }
}

TEST_CASE("ChunkPipeline refuses bad arguments before any stage runs") {
  const Stream cpu;
  Log log;
  REQUIRE_THROWS_QUINTET(overlap::ChunkPipeline::run(0, log.stages(true, true, 1), cpu),
                         InvalidArgument, "chunks = 0 must be >= 1");
  REQUIRE_THROWS_QUINTET(overlap::ChunkPipeline::run(2, log.stages(true, true, -1), cpu),
                         InvalidArgument, "lookahead = -1");
  overlap::ChunkStages no_compute = log.stages(true, true, 1);
  no_compute.compute = nullptr;
  REQUIRE_THROWS_QUINTET(overlap::ChunkPipeline::run(2, no_compute, cpu), InvalidArgument,
                         "a compute stage is required");
  CHECK(log.events.empty());
}
