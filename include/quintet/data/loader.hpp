// DataLoader: batches of training windows, prepared by C++ worker threads ahead of the consumer.
//
//   data::DataLoader loader(data::TokenDataset::open("data/train_*.qts"),
//                           {.seq_len = 1024, .batch_size = 8, .threads = 4,
//                            .device = Device::cuda(0)});
//   for (int step = 0; step < steps; ++step) {
//     data::Batch b = loader.next(compute);  // never synchronises the host with the GPU
//     b.wait(compute);                       // compute waits for the copy, on the GPU
//     model.forward(b.tokens, ...);
//   }
//   save(loader.state());                    // resume: config.start = saved state
//
// Workers claim batch numbers in order, read the windows chosen by the Sampler (sampler.hpp)
// from the mapped files into freshly allocated pinned host memory (plain memory without CUDA),
// and put them in a bounded ring of queue_depth batches; next() hands them out strictly in batch
// order, and blocks only when the next batch is not ready yet. Batches are the same whatever the
// number of threads. Tokens and targets are int32 ([batch_size, seq_len], row-major): int32
// holds every vocabulary in use, halves the bytes of int64 and is what embedding kernels index
// with; a stored token outside [0, 2^31) is an error.
//
// On a GPU, next(consumer) copies the batch to the device on the loader's own copy stream and
// returns with batch.ready recorded after the copy: nothing waits on the host. The device
// memory comes from consumer's pool (pass the same stream every call); before the copy writes
// it, the copy stream waits for the work already queued on consumer. The following batch, when
// ready, is copied right away too, so its copy overlaps the consumer's step. The pinned source
// stays owned by the loader until its copy has finished.
//
// A worker exception (a bad token, I/O error) is rethrown by next() when that batch is reached,
// and by every later call. The destructor stops and joins the workers (a batch being read is
// finished first). next() and state() are for one consumer thread.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "quintet/core/device.hpp"
#include "quintet/core/stream.hpp"
#include "quintet/core/tensor.hpp"
#include "quintet/data/sampler.hpp"
#include "quintet/data/token_dataset.hpp"

namespace quintet::data {

struct LoaderConfig {
  std::int64_t seq_len = 1024;    // tokens per sample (the window holds seq_len + 1)
  std::int64_t batch_size = 8;    // samples per batch on this rank (the only batch size)
  int threads = 4;                // worker threads, >= 1
  int queue_depth = 0;            // batches prepared ahead; 0 means 2 * threads (at least 4)
  Device device = Device::cpu();  // where next() delivers tokens and targets
  // The Sampler's (sampler.hpp): which windows, in which order, for which data-parallel replica.
  // Every rank of one replica (its tp, pp, cp and ep ranks) must read the same batches: take
  // dp_rank and dp_size from the mesh (quintet/parallel/data_parallel/loader_for_mesh.hpp does it).
  std::uint64_t seed = 0;
  int dp_rank = 0;
  int dp_size = 1;
  bool shuffle = true;  // false: every epoch in window order (evaluation)
  SamplerState start;   // where batch 0 starts (a saved DataLoader::state() to resume)
  // Tests and diagnosis: each batch's read takes this many milliseconds longer (a worker sleeps
  // before reading it), a slow disk simulated; >= 0. 0 in training.
  double read_delay_ms = 0.0;

  // The Sampler configuration these fields describe.
  SamplerConfig sampler_config() const {
    return SamplerConfig{seed, batch_size, dp_rank, dp_size, shuffle, start};
  }
};

struct Batch {
  Tensor tokens;                   // [batch_size, seq_len] int32 on the loader's device
  Tensor targets;                  // [batch_size, seq_len] int32, the tokens shifted by one
  std::uint64_t index = 0;         // batch number since the loader started
  std::vector<SampleRef> samples;  // which windows, in row order
  SamplerState next_state;         // the resume state once this batch is consumed
  // GPU only: recorded on the loader's copy stream after the copy (null on the CPU).
  std::shared_ptr<Event> ready;
  // Makes stream wait, on the GPU, until tokens and targets are on the device (no-op on the CPU).
  void wait(const Stream& stream) const;
};

struct LoaderStats {
  std::uint64_t batches = 0;  // batches returned by next()
  double wait_seconds = 0.0;  // time next() spent blocked on an empty queue
};

class DataLoader {
 public:
  // Starts config.threads workers. Throws InvalidArgument for bad sizes, a seq_len with no
  // window in the dataset, or a start state outside it.
  DataLoader(TokenDataset dataset, const LoaderConfig& config);
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // The next batch. On a GPU device the copy runs after the work queued on consumer (the device's
  // default stream for the overload without one); on the CPU consumer is ignored.
  Batch next();
  Batch next(const Stream& consumer);

  // The state after the last batch returned by next() (config.start before the first).
  SamplerState state() const;
  // Restarts the stream at start (a saved state()): the batches prepared ahead are dropped and
  // the next next() returns the batch that starts there, as a loader built with config.start =
  // start would. Throws InvalidArgument, leaving the loader as it was, for a state outside the
  // dataset. Not concurrent with next().
  void seek(const SamplerState& start);
  LoaderStats stats() const;
  const Sampler& sampler() const { return sampler_; }
  const Windows& windows() const { return windows_; }
  const LoaderConfig& config() const { return config_; }

 private:
  struct HostBatch;
  struct Slot;
  struct InFlight;
  void worker_loop();
  void start_workers();
  void stop_workers();  // joins them; the ring and its counters stay
  HostBatch fill(std::uint64_t n) const;
  // Takes batch next_consume_ from the ring; blocks when block is true, else may return false.
  bool take(HostBatch* out, bool block);
  Batch stage(HostBatch&& host, const Stream& consumer);
  void release_finished_copies();

  LoaderConfig config_;
  Windows windows_;
  Sampler sampler_;

  mutable std::mutex mutex_;
  std::condition_variable ready_cv_;  // a slot became ready (consumer waits)
  std::condition_variable space_cv_;  // a slot became free or stop (workers wait)
  std::vector<std::unique_ptr<Slot>> ring_;
  std::uint64_t next_claim_ = 0;    // next batch number a worker takes
  std::uint64_t next_consume_ = 0;  // next batch number next() takes from the ring
  bool stop_ = false;

  std::uint64_t returned_ = 0;  // batches handed out by next()
  std::exception_ptr failure_;  // sticky worker failure, rethrown by next()
  LoaderStats stats_;
  std::deque<Batch> staged_;  // GPU: copied (or copying) batches not yet returned
  std::deque<std::unique_ptr<InFlight>> in_flight_;  // pinned sources of unfinished copies
  std::unique_ptr<Stream> copy_stream_;
  std::unique_ptr<Event> consumer_mark_;
  std::vector<std::thread> workers_;
};

}  // namespace quintet::data
