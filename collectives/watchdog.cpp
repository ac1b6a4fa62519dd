#include "collectives/watchdog.hpp"

#include <algorithm>
#include <exception>

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

namespace quintet::detail {

Watchdog::Watchdog(std::string name, std::chrono::nanoseconds timeout,
                   std::chrono::nanoseconds period, Expired expired)
    : name_(std::move(name)), timeout_(timeout), period_(period), expired_(std::move(expired)) {
  QUINTET_CHECK(timeout_.count() > 0 && period_.count() > 0,
                "watchdog of '{}': timeout ({} ns) and period ({} ns) must be positive", name_,
                timeout_.count(), period_.count());
  QUINTET_CHECK(static_cast<bool>(expired_), "watchdog of '{}': no expiry handler", name_);
  thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() { (void)stop(); }

std::chrono::nanoseconds Watchdog::period_for(std::chrono::nanoseconds timeout) {
  return std::clamp<std::chrono::nanoseconds>(timeout / 10, std::chrono::milliseconds(10),
                                              std::chrono::seconds(1));
}

void Watchdog::add(std::shared_ptr<Op> op) {
  const Clock::time_point now = Clock::now();
  std::lock_guard lock(mutex_);
  QUINTET_CHECK(!stop_, "watchdog of '{}': an operation added after stop()", name_);
  reap_locked();
  ops_.push_back(Entry{std::move(op), now});
}

void Watchdog::reap_locked() noexcept {
  while (!ops_.empty() && ops_.front().op->poll()) {
    ops_.front().op->retired();
    ops_.pop_front();
  }
}

void Watchdog::reap() noexcept {
  std::lock_guard lock(mutex_);
  reap_locked();
}

std::size_t Watchdog::pending() const {
  std::lock_guard lock(mutex_);
  return ops_.size();
}

std::deque<std::shared_ptr<Watchdog::Op>> Watchdog::stop() noexcept {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard lock(mutex_);
  reap_locked();
  std::deque<std::shared_ptr<Op>> left;
  for (Entry& e : ops_) left.push_back(std::move(e.op));
  ops_.clear();
  return left;
}

void Watchdog::loop() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    cv_.wait_for(lock, period_, [&] { return stop_; });
    if (stop_) break;
    reap_locked();
    if (quiet_ || ops_.empty()) continue;
    const Entry oldest = ops_.front();
    const auto pending = Clock::now() - oldest.added;
    if (pending < timeout_) continue;
    lock.unlock();  // expired may take long (a dump, an abort) or end the process
    bool dealt = true;
    try {
      dealt = expired_(*oldest.op, pending);
    } catch (const std::exception& e) {
      log::error("watchdog of '{}': the expiry handler failed: {}", name_, e.what());
    } catch (...) {
      log::error("watchdog of '{}': the expiry handler failed", name_);
    }
    lock.lock();
    if (dealt) quiet_ = true;
  }
}

std::string expiry_message(const std::string& what, double timeout_s, double pending_s,
                           const std::string& laggards) {
  return fmt::format(
      "{} did not complete within {} s of being issued ({:.1f} s), and no thread waited for it "
      "(the communicator's timeout, --timeout-s): {}; the watchdog aborts the communicator and "
      "ends the process",
      what, timeout_s, pending_s,
      laggards.empty() ? "the GPU work it follows never finished, or a rank of the group did not "
                         "issue the matching operation, or is stopped, or failed"
                       : laggards);
}

}  // namespace quintet::detail
