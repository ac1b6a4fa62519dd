// Catch2 for Quintet's tests, the same on Catch2 v2 (Debian 12) and v3 (Ubuntu 24.04).
#pragma once

#if QUINTET_CATCH_MAJOR >= 3
#include <catch2/catch_approx.hpp>
#include <catch2/catch_test_macros.hpp>
#include <catch2/generators/catch_generators.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif

#include <string>

#include "quintet/core/error.hpp"

// REQUIRE_THROWS_QUINTET(expr, code, "substring"): expr throws a quintet::Error with that code
// whose message contains the substring (a non-empty one: "" would check no message).
#define REQUIRE_THROWS_QUINTET(expr, error_code, substring)              \
  do {                                                                   \
    REQUIRE(!std::string(substring).empty());                            \
    bool quintet_threw_ = false;                                         \
    try {                                                                \
      expr;                                                              \
    } catch (const ::quintet::Error& e) {                                \
      quintet_threw_ = true;                                             \
      INFO("message: " << e.what());                                     \
      CHECK(e.code() == ::quintet::ErrorCode::error_code);               \
      CHECK(std::string(e.what()).find(substring) != std::string::npos); \
    }                                                                    \
    if (!quintet_threw_) FAIL("expected a quintet::Error from: " #expr); \
  } while (0)
