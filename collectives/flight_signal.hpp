// FlightSignalDump: SIGUSR1 makes this process dump its flight recorder (flight_rank<r>.json)
// and go on running. The handler only writes a byte to a pipe (async-signal-safe); a thread
// reading the pipe writes the dump. mpirun passes SIGUSR1 on to every rank of the job.
//
// One per process at a time (quintet::init's World owns it; a second World alive at once gets
// none: install returns null); destruction restores the handler that was there before and joins
// the thread. Never throws from its destructor.
#pragma once

#include <csignal>
#include <memory>
#include <thread>

#include "collectives/flight_recorder.hpp"

namespace quintet::detail {

class FlightSignalDump {
 public:
  // Installs the SIGUSR1 handler, or returns null when another FlightSignalDump is alive. Throws
  // System when the pipe or the handler cannot be made.
  static std::unique_ptr<FlightSignalDump> install(std::shared_ptr<FlightRegistry> registry);
  FlightSignalDump(const FlightSignalDump&) = delete;
  FlightSignalDump& operator=(const FlightSignalDump&) = delete;
  ~FlightSignalDump();

 private:
  FlightSignalDump() = default;
  bool start();  // false: another one was installed meanwhile
  void loop();

  std::shared_ptr<FlightRegistry> registry_;
  int read_fd_ = -1;
  int write_fd_ = -1;
  struct sigaction previous_ {};
  std::thread thread_;
};

}  // namespace quintet::detail
