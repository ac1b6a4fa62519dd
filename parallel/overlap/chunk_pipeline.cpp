// ChunkPipeline: issues each chunk's stages in the order that overlaps them (chunk_pipeline.hpp).
#include "quintet/parallel/overlap/chunk_pipeline.hpp"

#include <utility>

#include "quintet/core/error.hpp"

namespace quintet::overlap {

void SentChunks::add(int chunk, Work w, std::function<void(int, const Stream&)> arrived) {
  works_.push_back(Entry{chunk, std::move(w), std::move(arrived)});
}

void SentChunks::finish(const Stream& stream) {
  std::vector<Entry> works = std::move(works_);
  works_.clear();
  for (Entry& e : works) {
    e.work.wait(stream);
    if (e.arrived) e.arrived(e.chunk, stream);
  }
}

SentChunks ChunkPipeline::run(int chunks, const ChunkStages& stages, const Stream& stream) {
  QUINTET_CHECK(chunks >= 1, "ChunkPipeline: chunks = {} must be >= 1", chunks);
  QUINTET_CHECK(stages.lookahead >= 0, "ChunkPipeline: lookahead = {} must be >= 0",
                stages.lookahead);
  QUINTET_CHECK(static_cast<bool>(stages.compute), "ChunkPipeline: a compute stage is required");
  const int ahead = stages.lookahead == 0 ? chunks : stages.lookahead;
  std::vector<Work> brought(static_cast<std::size_t>(chunks));
  int issued = 0;  // brings issued so far
  const auto bring_up_to = [&](int last) {
    for (; stages.bring && issued <= last && issued < chunks; ++issued) {
      brought[static_cast<std::size_t>(issued)] = stages.bring(issued);
    }
  };
  SentChunks sent;
  for (int c = 0; c < chunks; ++c) {
    bring_up_to(c + ahead);  // chunk c's input and the next `ahead` ones are on their way
    brought[static_cast<std::size_t>(c)].wait(stream);
    stages.compute(c);
    if (stages.send) sent.add(c, stages.send(c), stages.arrived);
  }
  return sent;
}

}  // namespace quintet::overlap
