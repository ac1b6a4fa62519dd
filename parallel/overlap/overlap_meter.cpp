// OverlapMeter: interval marks and the window totals (see overlap_meter.hpp for the contract).
#include "quintet/parallel/overlap/overlap_meter.hpp"

#include <algorithm>

namespace quintet::overlap {

namespace {

double ms_between(OverlapInterval::Clock::time_point a, OverlapInterval::Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// A timing event on device, reusing `slot` when it already holds one there.
Event& timing_event(std::optional<Event>& slot, const Device& device) {
  if (!slot || slot->device() != device) slot.emplace(device, /*timing=*/true);
  return *slot;
}

}  // namespace

void OverlapInterval::restart(OverlapKind kind, const Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  kind_ = kind;
  timing_event(start_, stream.device()).record(stream);
  host_start_ = Clock::now();
  host_end_.reset();
  end_recorded_ = false;
}

void OverlapInterval::end(const Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (host_end_) return;
  timing_event(end_, stream.device()).record(stream);
  host_end_ = Clock::now();
  end_recorded_ = true;
}

void OverlapInterval::restart_at(const Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (host_end_) return;
  timing_event(start_, stream.device()).record(stream);
  host_start_ = Clock::now();
}

void OverlapInterval::restart_on_host() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!host_end_) host_start_ = Clock::now();
}

void OverlapInterval::end_on_host() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!host_end_) host_end_ = Clock::now();
}

bool OverlapInterval::ended() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return host_end_.has_value();
}

void OverlapInterval::wait_for_start(const Stream& stream) const {
  std::lock_guard<std::mutex> lock(mutex_);
  start_->wait(stream);
}

double OverlapInterval::length_ms() const {
  if (end_recorded_ && end_->device() == start_->device()) {
    start_->synchronize();
    end_->synchronize();
    return std::max(0.0, static_cast<double>(end_->elapsed_ms(*start_)));
  }
  return std::max(0.0, ms_between(host_start_, *host_end_));
}

std::pair<double, double> OverlapInterval::position_ms(const std::optional<Event>& origin,
                                                       Clock::time_point host_origin) const {
  if (origin && end_recorded_ && start_->device() == origin->device() &&
      end_->device() == origin->device()) {
    origin->synchronize();
    start_->synchronize();
    end_->synchronize();
    return {start_->elapsed_ms(*origin), end_->elapsed_ms(*origin)};
  }
  return {ms_between(host_origin, host_start_), ms_between(host_origin, *host_end_)};
}

void OverlapMeter::recycle(std::vector<std::shared_ptr<OverlapInterval>> intervals) {
  // An interval still held elsewhere (a Work not yet destroyed) may still be ended: not reused.
  for (auto& interval : intervals) {
    if (interval.use_count() == 1) spare_.push_back(std::move(interval));
  }
}

void OverlapMeter::start_window(const Stream& origin) {
  start_window();
  timing_event(origin_, origin.device()).record(origin);
}

void OverlapMeter::start_window() {
  recycle(std::move(window_));
  window_.clear();
  origin_.reset();
  host_origin_ = OverlapInterval::Clock::now();
}

std::shared_ptr<OverlapInterval> OverlapMeter::begin(OverlapKind kind, const Stream& stream) {
  std::shared_ptr<OverlapInterval> interval;
  if (spare_.empty()) {
    interval = std::make_shared<OverlapInterval>();
  } else {
    interval = std::move(spare_.back());
    spare_.pop_back();
  }
  interval->restart(kind, stream);
  window_.push_back(interval);
  return interval;
}

OverlapTotals OverlapMeter::totals() const {
  OverlapTotals totals;
  std::vector<std::pair<double, double>> in_flight;
  for (const auto& interval : window_) {
    std::lock_guard<std::mutex> lock(interval->mutex_);
    if (!interval->host_end_) continue;
    if (interval->kind_ == OverlapKind::in_flight) {
      in_flight.push_back(interval->position_ms(origin_, host_origin_));
    } else {
      totals.exposed_ms += interval->length_ms();
      ++totals.exposed;
    }
  }
  totals.in_flight = static_cast<int>(in_flight.size());
  totals.comm_ms = union_length(std::move(in_flight));
  return totals;
}

OverlapTotals OverlapMeter::take() {
  const OverlapTotals result = totals();
  std::vector<std::shared_ptr<OverlapInterval>> open, done;
  for (auto& interval : window_) {
    if (!interval->ended() && interval.use_count() > 1) {
      open.push_back(std::move(interval));  // its holder may still end it, in a later window
    } else {
      done.push_back(std::move(interval));
    }
  }
  window_.clear();
  start_window();
  recycle(std::move(done));
  window_ = std::move(open);
  return result;
}

double union_length(std::vector<std::pair<double, double>> intervals) {
  std::sort(intervals.begin(), intervals.end());
  double total = 0.0, lo = 0.0, hi = 0.0;
  bool open = false;
  for (const auto& [s, e] : intervals) {
    if (!open || s > hi) {
      if (open) total += hi - lo;
      lo = s, hi = std::max(s, e), open = true;
    } else {
      hi = std::max(hi, e);
    }
  }
  if (open) total += hi - lo;
  return total;
}

}  // namespace quintet::overlap
