// Bootstrap: quintet::init() finds out how this process was launched, starts the communication
// runtime and returns the World: this rank's place in the job and the world communicators.
//
//   int main(int argc, char** argv) {
//     quintet::World world = quintet::init(argc, argv);   // --device cpu|cuda, --timeout-s ...
//     Tensor g = ...;                                    // on world.device()
//     world.comm().all_reduce(g).wait();
//   }
//
// Launchers, tried in this order:
//   - mpirun / srun (OpenMPI OMPI_COMM_WORLD_*, PMI_*/PMIX_*, SLURM_* variables, or MPI already
//     initialised): MPI is initialised with MPI_THREAD_MULTIPLE unless the program did it, and on
//     GPUs it broadcasts the NCCL unique id.
//   - RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun style, GPU runs only): rank 0 serves a
//     small TCP store at MASTER_PORT through which the NCCL unique id reaches every rank; a
//     master that cannot be reached is a Timeout error after RuntimeConfig::timeout_s.
//   - nothing: a single rank.
// Device: RuntimeConfig::device (--device / QUINTET_DEVICE) if given; otherwise cuda when a GPU
// is visible and the build has NCCL (or the job has one rank), else cpu. The GPU is
// cuda:(local_rank % visible GPUs).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "quintet/collectives/communicator.hpp"
#include "quintet/core/runtime_config.hpp"
#include "quintet/core/topology.hpp"

namespace quintet {

enum class Launcher { single, mpi, env };
std::string_view launcher_name(Launcher launcher);

// What the environment says about the launch, before anything is started. Under MPI the rank and
// sizes given here come from the launcher's variables where it sets them; init() asks MPI itself.
struct LaunchInfo {
  Launcher launcher = Launcher::single;
  int rank = 0;
  int size = 1;
  int local_rank = 0;  // rank among the processes of this node
  int local_size = 1;
  std::string master_addr;  // env launcher only
  int master_port = 0;
};

// Reads config.env only (no process is started). Throws InvalidArgument naming the variable when
// a launcher variable is malformed or a required one is missing (e.g. WORLD_SIZE > 1 without
// MASTER_ADDR).
LaunchInfo detect_launch(const RuntimeConfig& config);

namespace detail {
class TcpStoreServer;
struct MpiFinalizer;
class JobMonitor;
class FlightRegistry;
class FlightSignalDump;
}  // namespace detail

// This process's place in the job and its world communicators. Move-only. Destruction closes the
// communicators, then finalizes MPI if init() initialised it (and only then). Never throws.
//
// Failures: under mpirun with more than one rank, the first error of one rank reaches every rank
// (a rank failing alone must not leave the others waiting). A program catches its errors inside
// the World's scope, prints them, and calls fail():
//
//   quintet::World world = quintet::init(argc, argv);
//   try {
//     train(world);
//   } catch (const std::exception& e) {
//     std::fprintf(stderr, "train: %s\n", e.what());
//     world.fail(e, 2);  // the other ranks' waits now throw "rank r failed: ..."; ends the job
//   }
//
// Every wait of the world communicators and of their splits (Work::wait/synchronize) is bounded
// by RuntimeConfig::timeout_s (a Timeout error), and throws ErrorCode::Remote, "rank k failed:
// <its message>", within a fraction of a second of rank k's fail(). A rank blocked inside an MPI
// call (which cannot be interrupted) prints that message itself instead. A World destroyed by a
// propagating exception, or after another rank failed, publishes a failure too, skips the
// collective MPI_Finalize (which would hang), and ends the job when the process exits. On GPUs, an
// NCCL operation that no thread waits for and that has not completed timeout_s after it was issued
// ends the job too, with an error naming it and a flight-recorder dump (docs/reliability.md).
//
// Flight recorder (jobs of more than one rank; docs/reliability.md): every MPI communicator, the
// NCCL world communicator and its splits (the mesh's name their members; others find them over
// MPI under mpirun) keep their last RuntimeConfig::flight_size operations. This rank writes them
// all to <flight_dir>/flight_rank<r>.json when a wait times out (under mpirun the message then
// names the rank that is behind), when the NCCL watchdog ends it, when it fails (fail(), or an
// exception leaving the World's scope) or another rank's failure reaches it (mpirun), on SIGUSR1
// (the job goes on), and on dump_flight(). Jobs launched with RANK/WORLD_SIZE record their NCCL
// communicators and dump the same way, but cannot ask the other ranks or tell them of a failure.
// scripts/analyze_flight.py reads the dumps of every rank.
//
// With RuntimeConfig::check_collectives (--check-collectives), comm() and cpu_comm() check every
// operation's fingerprint across their ranks before it is sent (checked_communicator.hpp); so do
// their splits, and so the mesh's axes. It needs an MPI launch.
class World {
 public:
  World(World&&) noexcept;
  World& operator=(World&&) noexcept;
  ~World();

  int rank() const { return info_.rank; }
  int size() const { return info_.size; }
  int local_rank() const { return info_.local_rank; }
  int local_size() const { return info_.local_size; }
  Launcher launcher() const { return info_.launcher; }
  // The device this rank computes on (cpu or cuda:N).
  const Device& device() const { return device_; }
  const RuntimeConfig& config() const { return config_; }

  // Every rank's machine facts (core/topology.hpp), indexed by rank, exchanged by init: host, GPU
  // and its NUMA node, the CPUs each rank's threads run on (placed_cpus, RuntimeConfig::
  // cpu_affinity). With cpu_affinity auto, init binds its calling thread to this rank's
  // placed_cpus before it starts any thread, so every thread started from it afterwards (the
  // communicators' progress threads, the job monitor, NCCL's, the data loader's workers, the
  // checkpoint writer) runs there too.
  const std::vector<RankTopology>& topology() const { return topology_; }
  // The one-screen report of topology() (02_layout --topology; logged by rank 0 at start-up when
  // --log-level info or debug is given). loader_threads > 0: every rank's data loader runs that
  // many workers (the report warns when they outnumber a rank's CPUs).
  TopologyReport topology_report(int loader_threads = 0) const;

  // The world communicator for device(): NCCL on GPUs, MPI on the CPU, Self for one rank.
  Communicator& comm() const { return *comm_; }
  // A world communicator for CPU tensors (MPI, or Self for one rank); the same object as comm()
  // when device() is the CPU. Runs with the env launcher have none (no MPI): has_cpu_comm().
  bool has_cpu_comm() const { return cpu_comm_ != nullptr; }
  Communicator& cpu_comm() const;

  // This rank has failed with error, which the program has printed. With other ranks under
  // mpirun: publishes "rank <rank()> failed: <error.what()>" to every other rank (an error that is
  // itself another rank's failure, ErrorCode::Remote, is not passed on), waits up to 5 s for each
  // to print it or its own error, then ends the job with MPI_Abort(exit_code): it does not return.
  // Otherwise (one rank, no MPI) it writes this rank's flight recorder dump, if it has one, and
  // returns, and the program exits as it would. Never throws.
  void fail(const std::exception& error, int exit_code = 1) noexcept;

  // Writes this rank's flight recorder now (flight_rank<rank()>.json in RuntimeConfig::flight_dir)
  // with reason, and returns its path; "" for a job that has none (one rank) or when
  // the file could not be written (logged). Never throws.
  std::string dump_flight(std::string_view reason = "on demand") const noexcept;

 private:
  friend World init(const RuntimeConfig& config);
  World();

  // Declared first so that it is destroyed last, after every communicator.
  std::unique_ptr<detail::MpiFinalizer> finalizer_;
  RuntimeConfig config_;
  LaunchInfo info_;
  Device device_;
  std::unique_ptr<detail::TcpStoreServer> store_;
  std::unique_ptr<Communicator> cpu_comm_;
  std::unique_ptr<Communicator> device_comm_;  // null when comm() is the CPU communicator
  Communicator* comm_ = nullptr;
  // The job's failure channel (MPI jobs of more than one rank), shared with the communicators.
  std::shared_ptr<detail::JobMonitor> monitor_;
  // The flight recorders of this process, and the SIGUSR1 handler that dumps them.
  std::shared_ptr<detail::FlightRegistry> flight_;
  std::unique_ptr<detail::FlightSignalDump> flight_signal_;
  std::vector<RankTopology> topology_;
  int uncaught_at_init_ = 0;  // std::uncaught_exceptions() when init() made this World
};

// Initialises from the environment and argv (see RuntimeConfig::from_args). Collective over all
// ranks of the job.
World init(int argc, char** argv);
World init(const RuntimeConfig& config);

}  // namespace quintet
