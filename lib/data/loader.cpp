#include "quintet/data/loader.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "quintet/core/error.hpp"
#include "quintet/core/trace.hpp"

namespace quintet::data {

struct DataLoader::HostBatch {
  Tensor tokens, targets;  // pinned host memory, [batch_size, seq_len] int32
  std::uint64_t index = 0;
  std::vector<SampleRef> samples;
};

struct DataLoader::Slot {
  bool ready = false;
  HostBatch batch;
  std::exception_ptr error;
};

// Pinned buffers whose copy to the GPU may still be running, and the event that says it is done.
struct DataLoader::InFlight {
  std::shared_ptr<Event> done;
  Tensor tokens, targets;
};

namespace {

LoaderConfig checked(LoaderConfig c) {
  QUINTET_CHECK(c.seq_len >= 1 && c.batch_size >= 1,
                "DataLoader: seq_len {} and batch_size {} must be >= 1", c.seq_len, c.batch_size);
  QUINTET_CHECK(c.threads >= 1 && c.threads <= 1024, "DataLoader: threads {} must be in [1, 1024]",
                c.threads);
  QUINTET_CHECK(c.queue_depth >= 0, "DataLoader: queue_depth {} must be >= 0 (0 = automatic)",
                c.queue_depth);
  QUINTET_CHECK(std::isfinite(c.read_delay_ms) && c.read_delay_ms >= 0.0,
                "DataLoader: read_delay_ms {} must be a finite time >= 0", c.read_delay_ms);
  if (c.queue_depth == 0) c.queue_depth = std::max(4, 2 * c.threads);
  check_device(c.device);
  return c;
}

}  // namespace

void Batch::wait(const Stream& stream) const {
  if (ready) ready->wait(stream);
}

DataLoader::DataLoader(TokenDataset dataset, const LoaderConfig& config)
    : config_(checked(config)),
      windows_(std::move(dataset), config_.seq_len),
      sampler_(windows_.count(), config_.sampler_config()) {
  if (config_.device.is_cuda()) {
    copy_stream_ = std::make_unique<Stream>(Stream::create(config_.device));
    consumer_mark_ = std::make_unique<Event>(config_.device);
  }
  ring_.reserve(static_cast<std::size_t>(config_.queue_depth));
  for (int i = 0; i < config_.queue_depth; ++i) ring_.push_back(std::make_unique<Slot>());
  start_workers();
}

DataLoader::~DataLoader() {
  stop_workers();
  // Pinned buffers go back to the pool when in_flight_ is destroyed: their copies must be done.
  if (copy_stream_) {
    try {
      copy_stream_->synchronize();
    } catch (...) {  // destructors never throw; a failed stream has nothing left to wait for
    }
  }
}

void DataLoader::start_workers() {
  workers_.reserve(static_cast<std::size_t>(config_.threads));
  try {
    for (int i = 0; i < config_.threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  } catch (...) {
    stop_workers();
    throw;
  }
}

void DataLoader::stop_workers() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  space_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

void DataLoader::seek(const SamplerState& start) {
  LoaderConfig config = config_;
  config.start = start;
  Sampler sampler(windows_.count(), config.sampler_config());  // throws for a state outside
  stop_workers();
  // The prepared batches and the copies in flight belong to the old position.
  if (copy_stream_) copy_stream_->synchronize();
  staged_.clear();
  in_flight_.clear();
  for (auto& slot : ring_) *slot = Slot{};
  config_ = config;
  sampler_ = std::move(sampler);
  next_claim_ = 0;
  next_consume_ = 0;
  returned_ = 0;
  failure_ = nullptr;
  stop_ = false;
  start_workers();
}

void DataLoader::worker_loop() {
  const std::uint64_t depth = ring_.size();
  for (;;) {
    std::uint64_t n = 0;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      space_cv_.wait(lock, [&] { return stop_ || next_claim_ < next_consume_ + depth; });
      if (stop_) return;
      n = next_claim_++;
    }
    HostBatch batch;
    std::exception_ptr error;
    try {
      batch = fill(n);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      Slot& slot = *ring_[n % depth];
      slot.batch = std::move(batch);
      slot.error = error;
      slot.ready = true;
    }
    ready_cv_.notify_one();
  }
}

DataLoader::HostBatch DataLoader::fill(std::uint64_t n) const {
  if (config_.read_delay_ms > 0.0) {  // a slow disk, simulated (tests and diagnosis)
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(config_.read_delay_ms));
  }
  HostBatch b;
  b.index = n;
  b.samples = sampler_.batch(n);
  const std::int64_t T = config_.seq_len;
  b.tokens = Tensor::empty_pinned({config_.batch_size, T}, DType::i32);
  b.targets = Tensor::empty_pinned({config_.batch_size, T}, DType::i32);
  std::int32_t* tok = b.tokens.data<std::int32_t>();
  std::int32_t* tgt = b.targets.data<std::int32_t>();
  for (std::size_t i = 0; i < b.samples.size(); ++i) {
    windows_.read(b.samples[i].window, tok + i * T, tgt + i * T);
  }
  return b;
}

bool DataLoader::take(HostBatch* out, bool block) {
  std::unique_lock<std::mutex> lock(mutex_);
  Slot& slot = *ring_[next_consume_ % ring_.size()];
  if (!slot.ready) {
    if (!block) return false;
    const auto t0 = std::chrono::steady_clock::now();
    ready_cv_.wait(lock, [&] { return slot.ready; });
    stats_.wait_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  if (slot.error) {
    failure_ = slot.error;  // sticky: this batch and every later one fail
    return false;
  }
  *out = std::move(slot.batch);
  slot.batch = HostBatch{};
  slot.ready = false;
  ++next_consume_;
  lock.unlock();
  space_cv_.notify_one();  // one slot freed: one worker can claim it (waking all convoys them)
  return true;
}

Batch DataLoader::stage(HostBatch&& host, const Stream& consumer) {
  Batch b;
  b.index = host.index;
  b.samples = std::move(host.samples);
  b.next_state = sampler_.state_after(host.index + 1);
  if (config_.device.is_cpu()) {
    b.tokens = std::move(host.tokens);
    b.targets = std::move(host.targets);
    return b;
  }
  const Shape shape{config_.batch_size, config_.seq_len};
  b.tokens = Tensor::empty(shape, DType::i32, config_.device, consumer);
  b.targets = Tensor::empty(shape, DType::i32, config_.device, consumer);
  // The blocks may have been used by work still queued on consumer: the copy waits for it.
  consumer_mark_->record(consumer);
  consumer_mark_->wait(*copy_stream_);
  {
    const trace::Range copy(trace::TraceKind::h2d, "batch to device", *copy_stream_, 2);
    b.tokens.copy_(host.tokens, *copy_stream_);  // pinned source: asynchronous
    b.targets.copy_(host.targets, *copy_stream_);
  }
  b.ready = std::make_shared<Event>(config_.device);
  b.ready->record(*copy_stream_);
  auto flight = std::make_unique<InFlight>();
  flight->done = b.ready;
  flight->tokens = std::move(host.tokens);
  flight->targets = std::move(host.targets);
  in_flight_.push_back(std::move(flight));
  return b;
}

void DataLoader::release_finished_copies() {
  while (!in_flight_.empty() && in_flight_.front()->done->query()) in_flight_.pop_front();
}

Batch DataLoader::next() {
  if (config_.device.is_cpu()) return next(Stream());
  const Stream stream = Stream::default_stream(config_.device);
  return next(stream);
}

Batch DataLoader::next(const Stream& consumer) {
  if (failure_) std::rethrow_exception(failure_);
  QUINTET_CHECK(config_.device.is_cpu() || consumer.device() == config_.device,
                "DataLoader::next: the consumer stream is on {}, the loader delivers to {}; pass "
                "a stream of {}",
                consumer.device().str(), config_.device.str(), config_.device.str());
  Batch out;
  if (!staged_.empty()) {
    out = std::move(staged_.front());
    staged_.pop_front();
  } else {
    HostBatch host;
    {
      static const Stream host_clock;  // the wait is the host's
      const trace::Range wait(trace::TraceKind::loader, "loader wait", host_clock);
      if (!take(&host, /*block=*/true)) std::rethrow_exception(failure_);
    }
    out = stage(std::move(host), consumer);
  }
  if (config_.device.is_cuda()) {
    release_finished_copies();
    // Start the following batch's copy now, so that it overlaps the consumer's step.
    HostBatch host;
    if (staged_.empty() && take(&host, /*block=*/false)) {
      staged_.push_back(stage(std::move(host), consumer));
    }
  }
  ++returned_;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.batches;
  }
  return out;
}

SamplerState DataLoader::state() const { return sampler_.state_after(returned_); }

LoaderStats DataLoader::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

}  // namespace quintet::data
