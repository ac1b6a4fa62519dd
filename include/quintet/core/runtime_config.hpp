// RuntimeConfig: the runtime's settings, read once from QUINTET_* environment variables and
// command-line flags, then passed down explicitly. Nothing else in Quintet reads the environment.
//
//   QUINTET_DEVICE=cpu|cuda        --device cpu|cuda        which device tensors and comms use
//   QUINTET_LOG_LEVEL=info         --log-level LEVEL        debug, info, warn, error, off
//   QUINTET_TIMEOUT_S=300          --timeout-s SECONDS      bound on communicator init and waits
//   QUINTET_SEED=1234              --seed N                 base seed of random initialisation
//   QUINTET_MPI_IDLE_START_US=50   --mpi-idle-start-us US   how long a CPU communicator's thread,
//                                                           woken by a new operation, leaves it for
//                                                           its caller to run (0: start at once)
//   QUINTET_CHECK_COLLECTIVES=1    --check-collectives      debug mode: the ranks compare every
//                                                           operation's fingerprint before it is
//                                                           sent (checked_communicator.hpp)
//   QUINTET_FLIGHT_SIZE=2048       --flight-size N          operations each communicator's flight
//                                                           recorder keeps (0: sequence numbers
//                                                           only)
//   QUINTET_FLIGHT_DIR=DIR         --flight-dir DIR         where flight_rank<r>.json is written on
//                                                           a timeout, an error, SIGUSR1 or demand
//                                                           (default: the working directory)
//   QUINTET_CPU_AFFINITY=auto      --cpu-affinity auto|none auto: quintet::init binds the rank's
//                                                           threads to the CPUs next to its GPU
//                                                           (CPU ranks: its own or its share of the
//                                                           host's); none: the OS places them
//                                                           (core/topology.hpp, docs/topology.md)
//
// Flags win over the environment; unknown flags are left for the program (see remaining_args).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "quintet/core/log.hpp"
#include "quintet/core/topology.hpp"

namespace quintet {

enum class DevicePreference { automatic, cpu, cuda };

struct RuntimeConfig {
  DevicePreference device = DevicePreference::automatic;  // automatic: cuda when a GPU is visible
  LogLevel log_level = LogLevel::info;
  // Whether --log-level or QUINTET_LOG_LEVEL set log_level: asked for info, quintet::init logs
  // the topology report (its default level, info too, leaves start-up quiet).
  bool log_level_given = false;
  double timeout_s = 300.0;
  std::uint64_t seed = 1234;
  double mpi_idle_start_us = 50.0;
  // quintet::init wraps the world communicators (and so their splits) in the collective check
  // (checked_communicator.hpp). Off by default. The flag takes no value (--check-collectives=0|1
  // also works); the variable takes 1/0, true/false, on/off.
  bool check_collectives = false;
  // The flight recorder (docs/reliability.md): the last flight_size operations of every
  // communicator, dumped to flight_dir/flight_rank<r>.json ("": the working directory).
  std::size_t flight_size = 2048;
  std::string flight_dir;
  // Where the rank's threads run. It belongs to the runtime, not to a trainer's JobConfig: every
  // program's threads (the communicators' progress threads first, started by quintet::init) are
  // placed, and init places them before it starts any.
  CpuAffinity cpu_affinity = CpuAffinity::automatic;
  // Every variable of the environment that was read, for error messages and launchers
  // (MPI/SLURM/torchrun variables used by bootstrap live here too).
  std::map<std::string, std::string> env;
  // Arguments not consumed by from_args, in order (argv[0] first).
  std::vector<std::string> remaining_args;

  // Reads the environment (QUINTET_* and the launcher variables bootstrap understands).
  static RuntimeConfig from_env();
  // from_env(), then the flags above from argv (both "--flag value" and "--flag=value").
  // Throws InvalidArgument naming the flag or variable on a bad value.
  static RuntimeConfig from_args(int argc, const char* const* argv);
  // Same, from an explicit environment (for tests).
  static RuntimeConfig from(const std::map<std::string, std::string>& env,
                            const std::vector<std::string>& args);

  // The value of an environment variable that was read, if set.
  std::optional<std::string> get_env(const std::string& name) const;
};

}  // namespace quintet
