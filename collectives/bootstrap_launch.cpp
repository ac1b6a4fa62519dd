// detect_launch: how this process was started, read from the launcher variables that
// RuntimeConfig captured (nothing here reads the environment itself).
#include <charconv>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/error.hpp"

namespace quintet {

namespace {

int parse_int(const RuntimeConfig& c, const std::string& name, int min_value) {
  const std::string v = *c.get_env(name);
  int x = 0;
  const auto [ptr, ec] = std::from_chars(v.data(), v.data() + v.size(), x);
  QUINTET_CHECK(ec == std::errc() && ptr == v.data() + v.size() && x >= min_value,
                "launcher variable {}='{}': expected an integer >= {}", name, v, min_value);
  return x;
}

// The first of names that is set, parsed; fallback when none is.
int first_int(const RuntimeConfig& c, std::initializer_list<const char*> names, int min_value,
              int fallback) {
  for (const char* n : names) {
    if (c.get_env(n)) return parse_int(c, n, min_value);
  }
  return fallback;
}

bool any_set(const RuntimeConfig& c, std::initializer_list<const char*> names) {
  for (const char* n : names) {
    if (c.get_env(n)) return true;
  }
  return false;
}

}  // namespace

std::string_view launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::single:
      return "single";
    case Launcher::mpi:
      return "mpi";
    case Launcher::env:
      return "env";
  }
  return "unknown";
}

LaunchInfo detect_launch(const RuntimeConfig& c) {
  LaunchInfo info;
  if (any_set(c, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})) {
    info.launcher = Launcher::mpi;
    info.rank =
        first_int(c, {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"}, 0, 0);
    info.size = first_int(c, {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, 1, 1);
    info.local_rank =
        first_int(c, {"OMPI_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK", "SLURM_LOCALID"}, 0, 0);
    info.local_size = first_int(
        c, {"OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"}, 1, 1);
    return info;
  }
  if (!c.get_env("RANK") && !c.get_env("WORLD_SIZE")) return info;  // a single rank
  QUINTET_CHECK(c.get_env("RANK") && c.get_env("WORLD_SIZE"),
                "launcher variables: {} is set but {} is not; set both RANK and WORLD_SIZE (and "
                "MASTER_ADDR, MASTER_PORT) on every rank, or neither",
                c.get_env("RANK") ? "RANK" : "WORLD_SIZE",
                c.get_env("RANK") ? "WORLD_SIZE" : "RANK");
  info.size = parse_int(c, "WORLD_SIZE", 1);
  info.rank = parse_int(c, "RANK", 0);
  QUINTET_CHECK(info.rank < info.size, "launcher variables: RANK={} is not below WORLD_SIZE={}",
                info.rank, info.size);
  info.local_rank = first_int(c, {"LOCAL_RANK"}, 0, info.rank);
  info.local_size = first_int(c, {"LOCAL_WORLD_SIZE"}, 1, info.size);
  if (info.size == 1) return info;  // one rank needs no store
  info.launcher = Launcher::env;
  QUINTET_CHECK(c.get_env("MASTER_ADDR") && c.get_env("MASTER_PORT"),
                "launcher variables: RANK={} WORLD_SIZE={} but MASTER_ADDR or MASTER_PORT is "
                "missing; set both to the host and a free port of rank 0",
                info.rank, info.size);
  info.master_addr = *c.get_env("MASTER_ADDR");
  info.master_port = parse_int(c, "MASTER_PORT", 1);
  QUINTET_CHECK(info.master_port <= 65535, "launcher variable MASTER_PORT={}: expected 1..65535",
                info.master_port);
  return info;
}

}  // namespace quintet
