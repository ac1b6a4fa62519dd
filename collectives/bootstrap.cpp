// quintet::init and World: start MPI or the TCP store, pick the device, build the world
// communicators (see bootstrap.hpp for the rules).
#include "quintet/collectives/bootstrap.hpp"

#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <exception>
#include <numeric>
#include <thread>
#include <utility>

#include "collectives/flight_recorder.hpp"
#include "collectives/flight_signal.hpp"
#include "collectives/mpi/job_monitor.hpp"
#include "collectives/split_exchange.hpp"
#include "collectives/tcp_store.hpp"
#include "collectives/topology_exchange.hpp"
#include "quintet/collectives/checked_communicator.hpp"
#include "quintet/collectives/mpi.hpp"
#include "quintet/core/config.hpp"
#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"
#if QUINTET_HAS_NCCL
#include "collectives/nccl/nccl_backend.hpp"
#endif

namespace quintet {

namespace detail {

// Finalizes MPI on destruction when init() initialised it.
struct MpiFinalizer {
  ~MpiFinalizer() {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
};

}  // namespace detail

namespace {

constexpr const char* kNcclIdKey = "quintet/world/nccl_unique_id";

// The monitor of a World destroyed while its job was failing: the process ends the job when it
// exits (after the program's own handler has printed the error), through this handler.
std::shared_ptr<detail::JobMonitor> g_failing_monitor;

void end_failing_job() {
  if (!g_failing_monitor) return;
  if (g_failing_monitor->published()) {
    g_failing_monitor->publish(std::string());  // only waits for the others to print
  } else {
    // Another rank failed; it ends the job once every rank has printed. Should it not (it died
    // meanwhile), this one does.
    std::this_thread::sleep_for(detail::JobMonitor::kAckWait + std::chrono::seconds(1));
  }
  g_failing_monitor->abort_job(1);
}

bool mpi_initialized() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  QUINTET_CHECK(!finalized,
                "quintet::init: MPI was already finalized; call init() before "
                "MPI_Finalize, once per process");
  return initialized != 0;
}

// Starts MPI if needed; returns true when this call initialised it.
bool start_mpi() {
  bool initialised_here = false;
  if (!mpi_initialized()) {
    int provided = 0;
    QUINTET_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    initialised_here = true;
  }
  int level = 0;
  QUINTET_MPI_CHECK(MPI_Query_thread(&level));
  QUINTET_CHECK(level == MPI_THREAD_MULTIPLE,
                "quintet::init: MPI provides thread level {} but Quintet runs MPI calls on one "
                "thread per communicator and needs MPI_THREAD_MULTIPLE ({}); initialise MPI with "
                "MPI_Init_thread(..., MPI_THREAD_MULTIPLE, ...) or use an MPI built with thread "
                "support",
                level, MPI_THREAD_MULTIPLE);
  return initialised_here;
}

Device choose_device(const RuntimeConfig& config, const LaunchInfo& info) {
  const int gpus = cuda_device_count();
  const bool nccl = QUINTET_HAS_NCCL != 0;
  bool use_cuda = false;
  switch (config.device) {
    case DevicePreference::cpu:
      use_cuda = false;
      break;
    case DevicePreference::cuda:
      QUINTET_CHECK(gpus > 0,
                    "quintet::init: --device cuda (or QUINTET_DEVICE=cuda) but no GPU is "
                    "visible{}; use --device cpu",
                    QUINTET_HAS_CUDA ? "" : " (built without CUDA)");
      QUINTET_CHECK(nccl || info.size == 1,
                    "quintet::init: --device cuda with {} ranks needs NCCL, and this Quintet was "
                    "built without it; rebuild with -DQUINTET_WITH_NCCL=ON or use --device cpu",
                    info.size);
      use_cuda = true;
      break;
    case DevicePreference::automatic:
      use_cuda = gpus > 0 && (nccl || info.size == 1);
      break;
  }
  if (info.launcher == Launcher::env) {
    QUINTET_CHECK(use_cuda,
                  "quintet::init: launched with RANK/WORLD_SIZE={} (no MPI launcher), which only "
                  "supports GPU runs over NCCL, but the device is the CPU ({}); launch CPU runs "
                  "with mpirun, or run on GPUs",
                  info.size, gpus > 0 ? "--device cpu" : "no GPU visible or no NCCL");
  }
  return use_cuda ? Device::cuda(info.local_rank % gpus) : Device::cpu();
}

}  // namespace

World::World() = default;
World::World(World&&) noexcept = default;
World& World::operator=(World&& other) noexcept {
  if (this == &other) return *this;
  // Release this world's communicators before its MPI finalizer (if any) is replaced.
  device_comm_.reset();
  cpu_comm_.reset();
  store_.reset();
  config_ = std::move(other.config_);
  info_ = std::move(other.info_);
  device_ = other.device_;
  store_ = std::move(other.store_);
  cpu_comm_ = std::move(other.cpu_comm_);
  device_comm_ = std::move(other.device_comm_);
  comm_ = std::exchange(other.comm_, nullptr);
  monitor_ = std::move(other.monitor_);
  flight_signal_ = std::move(other.flight_signal_);
  flight_ = std::move(other.flight_);
  topology_ = std::move(other.topology_);
  uncaught_at_init_ = other.uncaught_at_init_;
  finalizer_ = std::move(other.finalizer_);
  return *this;
}

World::~World() {
  // Destroyed by a propagating exception, or after another rank failed: the job is failing, and
  // ranks may be blocked in collectives that will never complete. Tell the others (the program's
  // handler prints the message), skip the collective MPI_Finalize, and end the job at exit.
  const bool unwinding = std::uncaught_exceptions() > uncaught_at_init_;
  if (flight_ && !monitor_ && unwinding) {
    (void)flight_->dump_on_failure(
        "an exception propagated out of the scope of its quintet::World");
  }
  if (monitor_ && (unwinding || monitor_->failing())) {
    try {
      if (!monitor_->failing()) {
        monitor_->publish_nowait(fmt::format(
            "an exception propagated out of the scope of its quintet::World (its message is "
            "printed by rank {}; call World::fail in the handler to pass it on)",
            info_.rank));
      }
      monitor_->acknowledge();
      if (!g_failing_monitor) {
        g_failing_monitor = monitor_;
        std::atexit(end_failing_job);
      }
    } catch (...) {
    }
    (void)finalizer_.release();  // intentionally leaked: MPI_Finalize would wait for the others
  }
  // Members go in reverse order: communicators, then the store, then (last) MPI.
  device_comm_.reset();
  cpu_comm_.reset();
  store_.reset();
}

void World::fail(const std::exception& error, int exit_code) noexcept {
  if (!monitor_) {
    // One rank, or no MPI: the program exits as it would, after the dump (RANK/WORLD_SIZE jobs).
    if (flight_) (void)flight_->dump_on_failure(error.what());
    return;
  }
  const auto* e = dynamic_cast<const Error*>(&error);
  if (e != nullptr && e->code() == ErrorCode::Remote) {
    // Another rank's failure, now printed: that rank ends the job once every rank has printed;
    // should it not (it died meanwhile), this one does.
    monitor_->acknowledge();
    std::this_thread::sleep_for(detail::JobMonitor::kAckWait + std::chrono::seconds(1));
    monitor_->abort_job(exit_code);
  }
  monitor_->publish(error.what());
  monitor_->abort_job(exit_code);
}

std::string World::dump_flight(std::string_view reason) const noexcept {
  return flight_ ? flight_->dump(reason) : std::string();
}

TopologyReport World::topology_report(int loader_threads) const {
  std::vector<RankTopology> ranks = topology_;
  if (loader_threads > 0) {
    for (RankTopology& r : ranks) r.loader_threads = loader_threads;
  }
  return quintet::topology_report(ranks, config_.cpu_affinity);
}

Communicator& World::cpu_comm() const {
  QUINTET_CHECK(cpu_comm_ != nullptr,
                "World::cpu_comm: this job was launched with RANK/WORLD_SIZE (no MPI), so it has "
                "no CPU world communicator; launch with mpirun to get one");
  return *cpu_comm_;
}

World init(int argc, char** argv) { return init(RuntimeConfig::from_args(argc, argv)); }

World init(const RuntimeConfig& config) {
  log::set_level(config.log_level);
  World w;
  w.config_ = config;
  w.info_ = detect_launch(config);
  if (w.info_.launcher != Launcher::env && mpi_initialized()) w.info_.launcher = Launcher::mpi;
  // Until init returns, an exception that destroys w is init's own failure, which every rank meets
  // in its own init (no rank is past it): w does not publish it.
  w.uncaught_at_init_ = INT_MAX;
  MpiOptions mpi_options;
  mpi_options.timeout_s = config.timeout_s;
  mpi_options.idle_start_delay_us = config.mpi_idle_start_us;
  mpi_options.flight_size = config.flight_size;

  if (w.info_.launcher == Launcher::mpi) {
    if (start_mpi()) w.finalizer_ = std::make_unique<detail::MpiFinalizer>();
    QUINTET_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &w.info_.rank));
    QUINTET_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &w.info_.size));
    MPI_Comm node = MPI_COMM_NULL;
    QUINTET_MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, w.info_.rank,
                                          MPI_INFO_NULL, &node));
    QUINTET_MPI_CHECK(MPI_Comm_rank(node, &w.info_.local_rank));
    QUINTET_MPI_CHECK(MPI_Comm_size(node, &w.info_.local_size));
    QUINTET_MPI_CHECK(MPI_Comm_free(&node));
  }
  log::set_rank(w.info_.rank);
  w.device_ = choose_device(config, w.info_);
  set_current_device(w.device_);

  // The env launcher's store (GPU runs of more than one rank): the topology and the NCCL id go
  // through it.
  std::unique_ptr<detail::TcpStoreClient> client;
  if (w.info_.launcher == Launcher::env && w.info_.size > 1) {
    if (w.info_.rank == 0) w.store_ = std::make_unique<detail::TcpStoreServer>(w.info_.master_port);
    client = std::make_unique<detail::TcpStoreClient>(w.info_.master_addr, w.info_.master_port,
                                                      config.timeout_s);
  }
  // Placement, before any thread of Quintet starts: they inherit the calling thread's CPUs.
  w.topology_ = detail::place_this_rank(w.info_, w.device_, config, client.get());
  if (config.log_level_given && w.info_.rank == 0) {
    log::info("\n{}", topology_report(w.topology_, config.cpu_affinity).text());
  }

  if (w.info_.launcher != Launcher::single && w.info_.size > 1) {
    // Under RANK/WORLD_SIZE too: its NCCL communicators record, and a rank dumps when the
    // watchdog ends it, on World::fail, on SIGUSR1 and on demand (there is no MPI to carry the
    // first failure to the other ranks, nor to ask them how far they got).
    w.flight_ = std::make_shared<detail::FlightRegistry>(w.info_.rank, w.info_.size,
                                                         config.flight_dir, config.flight_size);
    w.flight_signal_ = detail::FlightSignalDump::install(w.flight_);
  }
  if (w.info_.launcher == Launcher::mpi && w.info_.size > 1) {
    w.monitor_ = std::make_shared<detail::JobMonitor>(MPI_COMM_WORLD, w.flight_);
    mpi_options.monitor = w.monitor_;
    mpi_options.flight = w.flight_;
  }

  if (w.info_.launcher == Launcher::mpi) {
    w.cpu_comm_ = make_mpi_communicator(MPI_COMM_WORLD, "world", mpi_options);
  } else if (w.info_.launcher == Launcher::single) {
    w.cpu_comm_ = make_self_communicator(Device::cpu(), "world");
  }

  if (w.device_.is_cpu()) {
    w.comm_ = w.cpu_comm_.get();
  } else if (w.info_.size == 1) {
    w.device_comm_ = make_self_communicator(w.device_, "world");
    w.comm_ = w.device_comm_.get();
  } else {
#if QUINTET_HAS_NCCL
    std::vector<char> id;
    if (w.info_.launcher == Launcher::mpi) {
      if (w.info_.rank == 0) id = detail::nccl_make_unique_id();
      int n = static_cast<int>(id.size());
      QUINTET_MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD));
      id.resize(static_cast<std::size_t>(n));
      QUINTET_MPI_CHECK(MPI_Bcast(id.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD));
    } else {
      if (w.info_.rank == 0) {
        id = detail::nccl_make_unique_id();
        client->set(kNcclIdKey, id);
      } else {
        id = client->get(kNcclIdKey);
      }
    }
    detail::NcclOptions nccl;
    nccl.timeout_s = config.timeout_s;
    if (w.flight_) {  // world ranks are the NCCL world's ranks
      nccl.flight = w.flight_;
      nccl.world_ranks.resize(static_cast<std::size_t>(w.info_.size));
      std::iota(nccl.world_ranks.begin(), nccl.world_ranks.end(), 0);
      // Splits made without members (not the Mesh's) find them over MPI.
      if (w.info_.launcher == Launcher::mpi) {
        nccl.split_exchange = std::make_shared<detail::SplitExchange>(MPI_COMM_WORLD);
      }
    }
    if (w.monitor_) {
      // A timed-out operation names the rank that is behind, asking the others over the monitor.
      nccl.progress = detail::progress_channel(w.monitor_);
      // A watchdog expiry ends the whole job, telling every rank why.
      nccl.end_process = [monitor = w.monitor_](const std::string& message) {
        monitor->publish(message);
        monitor->abort_job(1);
      };
    }
    w.device_comm_ =
        detail::nccl_create_communicator(id, w.info_.rank, w.info_.size, w.device_, nccl, "world");
    w.comm_ = w.device_comm_.get();
#else
    QUINTET_THROW(InvalidArgument,
                  "quintet::init: a {}-rank GPU world needs NCCL, which this "
                  "build lacks; use --device cpu",
                  w.info_.size);
#endif
  }
  if (config.check_collectives && w.info_.size > 1) {
    // The fingerprints travel over MPI: world ranks are MPI ranks (NCCL's world too).
    QUINTET_CHECK(w.info_.launcher == Launcher::mpi,
                  "quintet::init: --check-collectives (QUINTET_CHECK_COLLECTIVES) compares the "
                  "ranks' operations over MPI, and this job was launched with RANK/WORLD_SIZE (no "
                  "MPI); launch it with mpirun, or leave the check off");
    CollectiveCheckOptions check;
    check.timeout_s = config.timeout_s;
    check.monitor = w.monitor_;
    const bool same = w.comm_ == w.cpu_comm_.get();
    w.cpu_comm_ = make_checked_communicator(std::move(w.cpu_comm_), MPI_COMM_WORLD, check);
    if (w.device_comm_) {
      w.device_comm_ = make_checked_communicator(std::move(w.device_comm_), MPI_COMM_WORLD, check);
    }
    w.comm_ = same ? w.cpu_comm_.get() : w.device_comm_.get();
    log::debug(
        "quintet::init: --check-collectives: every operation's fingerprint is compared "
        "across its ranks before it is sent");
  }
  log::debug("quintet::init: rank {} of {} (local {} of {}), launcher {}, device {}", w.info_.rank,
             w.info_.size, w.info_.local_rank, w.info_.local_size, launcher_name(w.info_.launcher),
             w.device_.str());
  w.uncaught_at_init_ = std::uncaught_exceptions();
  return w;
}

}  // namespace quintet
