// The chunk descriptions of a model and their even cut.
#include "quintet/parallel/model/chunk_spec.hpp"

#include <fmt/format.h>

#include "quintet/core/error.hpp"

namespace quintet::model {

ChunkSpec ChunkSpec::whole(const GptConfig& config) {
  return ChunkSpec{0, config.layers, true, true};
}

void ChunkSpec::validate(const GptConfig& config) const {
  QUINTET_CHECK(first_layer >= 0 && num_layers >= 0 && first_layer + num_layers <= config.layers,
                "ChunkSpec: layers [{}, {}) are not inside the model's {} layers", first_layer,
                first_layer + num_layers, config.layers);
  QUINTET_CHECK(num_layers > 0 || embedding || head,
                "ChunkSpec: an empty chunk (no layers, no embedding, no head); give it at least "
                "one of them");
}

std::string ChunkSpec::str() const {
  std::string s = num_layers > 0
                      ? fmt::format("layers {}-{}", first_layer, first_layer + num_layers - 1)
                      : std::string("no layers");
  if (embedding) s += " + embedding";
  if (head) s += " + head";
  return s;
}

std::vector<ChunkSpec> split_into_chunks(const GptConfig& config, int chunks) {
  QUINTET_CHECK(chunks >= 1 && chunks <= config.layers,
                "split_into_chunks: {} chunks for {} layers; every chunk needs at least one layer "
                "(1 <= chunks <= layers)",
                chunks, config.layers);
  std::vector<ChunkSpec> out;
  const std::int64_t base = config.layers / chunks, extra = config.layers % chunks;
  std::int64_t first = 0;
  for (int c = 0; c < chunks; ++c) {
    const std::int64_t n = base + (c < extra ? 1 : 0);
    out.push_back(ChunkSpec{first, n, c == 0, c == chunks - 1});
    first += n;
  }
  return out;
}

}  // namespace quintet::model
