// Private: element-wise kernels over many tensors in one launch (the optimizer's update and the
// gradient norm, which would otherwise be one launch per parameter tensor). A launch takes up to
// kMaxTensors tensors, passed by value as kernel parameters (no device table to upload), and sees
// them as one concatenated range of elements: entry t covers [begin[t], begin[t + 1]). Blocks
// walk that range in chunks; a thread finds the entry of its element by moving forward from the
// entry of its chunk's start. C++17 (compiled by nvcc).
#pragma once

#include <cstdint>
#include <vector>

#include "nn/cuda/kernel_common.cuh"

namespace quintet::nn::cuda_ops::detail {

// Entries per launch: 64 entries of up to 56 bytes stay inside the 4 KB of kernel parameters
// every architecture and toolkit accepts.
constexpr int kMaxTensors = 64;

template <class Entry>
struct TensorList {
  int count = 0;
  std::int64_t begin[kMaxTensors + 1] = {};
  Entry entry[kMaxTensors];
};

// The index of the entry holding element i of the concatenated range, searched from entry t
// (an entry at or before it).
template <class Entry>
__device__ __forceinline__ int entry_of(const TensorList<Entry>& list, int t, std::int64_t i) {
  while (i >= list.begin[t + 1]) ++t;
  return t;
}

// The first entry of the chunk starting at element i (binary search over begin).
template <class Entry>
__device__ __forceinline__ int first_entry(const TensorList<Entry>& list, std::int64_t i) {
  int lo = 0, hi = list.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (list.begin[mid] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// Calls launch(list, total_elements) once per group of up to kMaxTensors entries of entries
// (with their element counts in numel), skipping empty ones.
template <class Entry, class Launch>
void for_each_tensor_list(const std::vector<Entry>& entries, const std::vector<std::int64_t>& numel,
                          Launch&& launch) {
  TensorList<Entry> list;
  auto flush = [&] {
    if (list.count > 0) launch(list, list.begin[list.count]);
    list.count = 0;
  };
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (numel[i] == 0) continue;
    list.entry[list.count] = entries[i];
    list.begin[list.count + 1] = list.begin[list.count] + numel[i];
    ++list.count;
    if (list.count == kMaxTensors) flush();
  }
  flush();
}

// for_each_tensor_list in two passes: the entries whose element count is a multiple of `group`
// and for which fits(entry) holds (its pointers aligned for group-element vectors) through
// grouped(list, total), with the counts (begin, total) in groups of `group` elements; the others
// through single(list, total), element by element.
template <class Entry, class Fits, class Grouped, class Single>
void for_each_tensor_list_grouped(const std::vector<Entry>& entries,
                                  const std::vector<std::int64_t>& numel, std::int64_t group,
                                  Fits&& fits, Grouped&& grouped, Single&& single) {
  std::vector<Entry> grouped_entries, single_entries;
  std::vector<std::int64_t> grouped_numel, single_numel;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (numel[i] % group == 0 && fits(entries[i])) {
      grouped_entries.push_back(entries[i]);
      grouped_numel.push_back(numel[i] / group);
    } else {
      single_entries.push_back(entries[i]);
      single_numel.push_back(numel[i]);
    }
  }
  for_each_tensor_list(grouped_entries, grouped_numel, grouped);
  for_each_tensor_list(single_entries, single_numel, single);
}

// Elements a block handles per chunk of the concatenated range.
constexpr std::int64_t kChunk = 4 * kThreads;

// Blocks for a range of n elements: one per chunk, at most enough to fill the GPU a few times.
inline unsigned chunk_blocks(std::int64_t n) {
  const std::int64_t chunks = (n + kChunk - 1) / kChunk;
  return static_cast<unsigned>(std::max<std::int64_t>(1, std::min<std::int64_t>(chunks, 8192)));
}

// Calls f(entry index, offset within the entry) for every element of the list, each once,
// coalesced within an entry. Used inside a kernel launched with chunk_blocks(total).
template <class Entry, class F>
__device__ __forceinline__ void for_each_element(const TensorList<Entry>& list, std::int64_t total,
                                                 F&& f) {
  for (std::int64_t start = blockIdx.x * kChunk; start < total;
       start += static_cast<std::int64_t>(gridDim.x) * kChunk) {
    const std::int64_t end = start + kChunk < total ? start + kChunk : total;
    int t = first_entry(list, start);
    for (std::int64_t i = start + threadIdx.x; i < end; i += blockDim.x) {
      t = entry_of(list, t, i);
      f(t, i - list.begin[t]);
    }
  }
}

}  // namespace quintet::nn::cuda_ops::detail
