// The baseline a user would write first: for each sample, fseek + fread its window from the file
// and convert it, synchronously, on the training thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <vector>

#include "quintet/data/sampler.hpp"
#include "quintet/data/token_dataset.hpp"

class NaiveReader {
 public:
  NaiveReader(const quintet::data::Windows& windows);
  ~NaiveReader();
  NaiveReader(const NaiveReader&) = delete;
  NaiveReader& operator=(const NaiveReader&) = delete;

  // Reads samples' windows into tokens and targets ([samples, seq_len] int32 each).
  void read_batch(const std::vector<quintet::data::SampleRef>& samples, std::int32_t* tokens,
                  std::int32_t* targets);

 private:
  const quintet::data::Windows& windows_;
  std::vector<std::FILE*> files_;
  std::vector<unsigned char> buffer_;
};
