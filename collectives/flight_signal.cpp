#include "collectives/flight_signal.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "quintet/core/error.hpp"

namespace quintet::detail {

namespace {

// The pipe's write end, for the handler (-1: none). A lock-free atomic is async-signal-safe.
std::atomic<int> g_signal_pipe{-1};
static_assert(std::atomic<int>::is_always_lock_free);

constexpr char kDump = 'd';
constexpr char kQuit = 'q';

extern "C" void on_sigusr1(int) {
  const int saved = errno;
  const int fd = g_signal_pipe.load(std::memory_order_relaxed);
  if (fd >= 0) {
    const char c = kDump;
    [[maybe_unused]] const ssize_t n = write(fd, &c, 1);  // full pipe: a dump is pending anyway
  }
  errno = saved;
}

}  // namespace

std::unique_ptr<FlightSignalDump> FlightSignalDump::install(
    std::shared_ptr<FlightRegistry> registry) {
  if (g_signal_pipe.load() >= 0) return nullptr;
  std::unique_ptr<FlightSignalDump> d(new FlightSignalDump());
  d->registry_ = std::move(registry);
  if (!d->start()) return nullptr;
  return d;
}

bool FlightSignalDump::start() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    QUINTET_THROW(System, "flight recorder: pipe2 failed: {}", std::strerror(errno));
  }
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  fcntl(write_fd_, F_SETFL, O_NONBLOCK);  // the handler never blocks
  int expected = -1;
  if (!g_signal_pipe.compare_exchange_strong(expected, write_fd_)) {
    close(read_fd_);
    close(write_fd_);
    read_fd_ = write_fd_ = -1;
    return false;  // another World installed one meanwhile
  }
  struct sigaction action {};
  action.sa_handler = on_sigusr1;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  if (sigaction(SIGUSR1, &action, &previous_) != 0) {
    const int e = errno;
    g_signal_pipe.store(-1);
    close(read_fd_);
    close(write_fd_);
    read_fd_ = write_fd_ = -1;
    QUINTET_THROW(System, "flight recorder: sigaction(SIGUSR1) failed: {}", std::strerror(e));
  }
  thread_ = std::thread(&FlightSignalDump::loop, this);
  return true;
}

FlightSignalDump::~FlightSignalDump() {
  if (write_fd_ < 0) return;
  sigaction(SIGUSR1, &previous_, nullptr);
  g_signal_pipe.store(-1);
  const char c = kQuit;
  while (write(write_fd_, &c, 1) < 0 && (errno == EINTR || errno == EAGAIN)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // the thread drains the pipe
  }
  if (thread_.joinable()) thread_.join();
  close(read_fd_);
  close(write_fd_);
}

void FlightSignalDump::loop() {
  for (;;) {
    char c = 0;
    const ssize_t n = read(read_fd_, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == kQuit) return;
    registry_->dump("SIGUSR1");
  }
}

}  // namespace quintet::detail
