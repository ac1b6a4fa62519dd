// Private: the tp region boundaries cut into chunks along the sequence, each chunk's
// communication overlapping another chunk's GEMM (ChunkPipeline, chunk_pipeline.hpp). The layers
// of linear.hpp use these when their overlap_chunks is above 1; results equal the unchunked forms
// of regions.hpp (the chunking changes which rows a GEMM covers, never a row's arithmetic).
//
// Layout: with sequence parallelism a rank holds L = S/tp positions; chunk j of k is positions
// [j*L/k, (j+1)*L/k) of every rank's part, so one chunk's all-gather or reduce-scatter moves
// S/k positions, tp blocks of L/k, in the [tp, B, L/k, ...] layout the collective concatenates.
#pragma once

#include <functional>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/parallel/overlap/chunk_pipeline.hpp"

namespace quintet::tensor_parallel::detail {

// Applied to rows chunk by chunk: [m, F] rows -> [m, O] rows (a GEMM with its weights bound).
using RowMap = std::function<Tensor(const Tensor& rows)>;

// A result whose chunks are still being reduced: finish() makes stream wait for them and places
// them in value.
struct ChunkedPending {
  Tensor value;
  overlap::SentChunks sent;
  Tensor finish(const Stream& stream) {
    sent.finish(stream);
    return value;
  }
};

// Throws InvalidArgument, before any communication, unless chunks >= 1 and x's sequence (dim 1;
// with SP the local S/tp) is a multiple of chunks. what names the layer.
void check_chunks(const char* what, const Tensor& x, int chunks);
// The same for a full sequence that SP splits: seq must be a multiple of tp * chunks.
void check_sequence_chunks(const char* what, const Tensor& x, int tp, int chunks);

// SP: x [B, S/tp, F] -> f(gather_sequence(x)) as [B, S, O]: chunk j + 1's all-gather runs while
// chunk j's rows are mapped. With gathered set, *gathered = gather_sequence(x) as well.
Tensor gather_then_map(const Tensor& x, Communicator& tp, int chunks, const RowMap& f,
                       const Stream& stream, Tensor* gathered);

// SP: x [B, S, F] -> reduce_scatter_sequence(f(x)) as [B, S/tp, O]: chunk j's reduce-scatter runs
// while chunk j + 1's rows are mapped (and whatever the caller queues before finish()).
ChunkedPending map_then_reduce_scatter(const Tensor& x, Communicator& tp, int chunks,
                                       const RowMap& f, const Stream& stream);

// Without SP: x [B, S, F] -> the sum over tp of f(x), [B, S, O]: chunk j's all-reduce (rows
// [j*B*S/chunks, (j+1)*B*S/chunks)) runs while chunk j + 1's rows are mapped.
ChunkedPending map_then_all_reduce(const Tensor& x, Communicator& tp, int chunks, const RowMap& f,
                                   const Stream& stream);

}  // namespace quintet::tensor_parallel::detail
