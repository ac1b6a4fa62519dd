// RuntimeConfig: environment, flags, precedence and bad values.
#include "support/catch.hpp"

#include "quintet/core/runtime_config.hpp"

using namespace quintet;

TEST_CASE("environment then flags, flags win") {
  auto c = RuntimeConfig::from(
      {{"QUINTET_DEVICE", "cpu"}, {"QUINTET_TIMEOUT_S", "12.5"}, {"OMPI_COMM_WORLD_RANK", "3"}},
      {"prog", "--device=cuda", "--steps", "10", "--seed", "99"});
  CHECK(c.device == DevicePreference::cuda);
  CHECK(c.timeout_s == 12.5);
  CHECK(c.seed == 99);
  CHECK(c.get_env("OMPI_COMM_WORLD_RANK") == std::optional<std::string>("3"));
  CHECK(c.remaining_args == std::vector<std::string>{"prog", "--steps", "10"});
  CHECK(c.mpi_idle_start_us == 50.0);
  CHECK(RuntimeConfig::from({{"QUINTET_MPI_IDLE_START_US", "0"}}, {}).mpi_idle_start_us == 0.0);
  CHECK(RuntimeConfig::from({}, {"p", "--mpi-idle-start-us=20"}).mpi_idle_start_us == 20.0);
}

TEST_CASE("bad values name the variable or flag") {
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({{"QUINTET_DEVICE", "tpu"}}, {}), InvalidArgument,
                         "QUINTET_DEVICE");
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({}, {"p", "--timeout-s", "-1"}), InvalidArgument,
                         "--timeout-s");
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({}, {"p", "--seed"}), InvalidArgument,
                         "needs a value");
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({{"QUINTET_MPI_IDLE_START_US", "-3"}}, {}),
                         InvalidArgument, "QUINTET_MPI_IDLE_START_US");
}

TEST_CASE("flight recorder size and dump directory") {
  const RuntimeConfig d = RuntimeConfig::from({}, {});
  CHECK(d.flight_size == 2048);
  CHECK(d.flight_dir.empty());
  const RuntimeConfig e =
      RuntimeConfig::from({{"QUINTET_FLIGHT_SIZE", "16"}, {"QUINTET_FLIGHT_DIR", "/tmp/a"}}, {});
  CHECK(e.flight_size == 16);
  CHECK(e.flight_dir == "/tmp/a");
  const RuntimeConfig f = RuntimeConfig::from({{"QUINTET_FLIGHT_SIZE", "16"}},
                                              {"p", "--flight-size=0", "--flight-dir", "out"});
  CHECK(f.flight_size == 0);
  CHECK(f.flight_dir == "out");
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({{"QUINTET_FLIGHT_SIZE", "-1"}}, {}), InvalidArgument,
                         "QUINTET_FLIGHT_SIZE");
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({}, {"p", "--flight-size", "99999999"}),
                         InvalidArgument, "--flight-size");
  REQUIRE_THROWS_QUINTET(RuntimeConfig::from({}, {"p", "--flight-dir="}), InvalidArgument,
                         "--flight-dir");
}

TEST_CASE("from_env reads the process environment once") {
  const RuntimeConfig c = RuntimeConfig::from_env();
  CHECK(c.timeout_s > 0);
}
