// ChunkSpec: which part of the model one chunk holds (a pipeline stage, or one virtual stage of
// an interleaved schedule), and the even cut of a model into chunks. Pure values, implemented by
// parallel/model/chunk_spec.cpp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "quintet/parallel/model/gpt_config.hpp"

namespace quintet::model {

struct ChunkSpec {
  std::int64_t first_layer = 0;  // global index of the chunk's first block
  std::int64_t num_layers = 0;   // blocks first_layer .. first_layer + num_layers - 1
  bool embedding = false;        // starts with the token (and position) embedding: input ids
  bool head = false;             // ends with the final norm, the LM head and the loss

  // The whole model as one chunk.
  static ChunkSpec whole(const GptConfig& config);
  // Throws InvalidArgument unless the chunk lies inside config's layers and holds something. (With
  // tied embeddings, a head chunk without the embedding holds a copy of the table: gpt.hpp.)
  void validate(const GptConfig& config) const;
  // "layers 0-3 + embedding + head".
  std::string str() const;
};

// The model cut into `chunks` contiguous chunks of consecutive layers, in order: the first holds
// the embedding, the last the head; layer counts differ by at most one (the earlier chunks get the
// extra layers). Throws InvalidArgument unless 1 <= chunks <= config.layers.
std::vector<ChunkSpec> split_into_chunks(const GptConfig& config, int chunks);

}  // namespace quintet::model
