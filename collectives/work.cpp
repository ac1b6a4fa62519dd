#include "quintet/collectives/work.hpp"

#include "quintet/core/error.hpp"

namespace quintet {

void Work::wait(const Stream& stream) const {
  if (impl_) impl_->wait(stream);
}

void Work::synchronize() const {
  if (impl_) impl_->synchronize_for(std::chrono::nanoseconds::max());
}

void Work::wait_for(std::chrono::milliseconds timeout) const {
  if (!impl_) return;
  if (!impl_->synchronize_for(std::chrono::duration_cast<std::chrono::nanoseconds>(timeout))) {
    QUINTET_THROW(Timeout,
                  "{} did not finish within {} ms: a rank of the group may not have issued the "
                  "matching operation, or may have failed; check that every rank calls the same "
                  "collectives in the same order",
                  impl_->describe(), timeout.count());
  }
}

bool Work::is_completed() const { return !impl_ || impl_->is_completed(); }

std::string Work::describe() const { return impl_ ? impl_->describe() : "completed no-op"; }

}  // namespace quintet
