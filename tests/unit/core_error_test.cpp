// quintet::Error and the checking macros.
#include <mpi.h>

#include "support/catch.hpp"

#include "quintet/core/error.hpp"
#include "quintet/core/log.hpp"

using quintet::ErrorCode;

TEST_CASE("QUINTET_CHECK throws InvalidArgument with the message, condition and location") {
  const int world = 6;
  try {
    QUINTET_CHECK(world % 4 == 0, "world size {} does not divide by tp={}", world, 4);
    FAIL("no throw");
  } catch (const quintet::Error& e) {
    const std::string what = e.what();
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(what.find("world size 6 does not divide by tp=4") != std::string::npos);
    CHECK(what.find("world % 4 == 0") != std::string::npos);
    CHECK(what.find("core_error_test.cpp:") != std::string::npos);
  }
  QUINTET_CHECK(world == 6, "not reached");
}

TEST_CASE("QUINTET_THROW carries its code") {
  REQUIRE_THROWS_QUINTET(QUINTET_THROW(Timeout, "all_reduce #{} timed out", 3), Timeout,
                         "all_reduce #3 timed out");
}

TEST_CASE("library error macros name the call and the library's error string") {
  REQUIRE_THROWS_QUINTET(QUINTET_MPI_CHECK(MPI_ERR_COUNT), Mpi, "MPI_ERR_COUNT");
  int argc = 0;
  char** argv = nullptr;
  MPI_Init(&argc, &argv);
  REQUIRE_THROWS_QUINTET(QUINTET_MPI_CHECK(MPI_ERR_COUNT), Mpi, "invalid count");
  MPI_Finalize();
  REQUIRE_THROWS_QUINTET(QUINTET_CUDA_CHECK(2), Cuda, "CUDA call failed");
  REQUIRE_THROWS_QUINTET(QUINTET_NCCL_CHECK(3), Nccl, "NCCL call failed");
  QUINTET_NCCL_CHECK(7);  // ncclInProgress is not an error
  QUINTET_CUDA_CHECK(0);
}

TEST_CASE("error codes have names") {
  CHECK(quintet::to_string(ErrorCode::Remote) == "Remote");
  CHECK(quintet::to_string(ErrorCode::Aborted) == "Aborted");
}

TEST_CASE("log levels parse and reject unknown names") {
  CHECK(quintet::parse_log_level("warn") == quintet::LogLevel::warn);
  REQUIRE_THROWS_QUINTET(quintet::parse_log_level("loud"), InvalidArgument, "loud");
  quintet::log::set_level(quintet::LogLevel::error);
  CHECK(quintet::log::level() == quintet::LogLevel::error);
  quintet::log::info("not printed {}", 1);
  quintet::log::set_level(quintet::LogLevel::info);
}
