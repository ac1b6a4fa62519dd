// The TCP store of env (torchrun-style) launches, on localhost with threads standing in for ranks.
#include <atomic>
#include <chrono>
#include <thread>

#include "collectives/tcp_store.hpp"
#include "support/catch.hpp"

using quintet::detail::TcpStoreClient;
using quintet::detail::TcpStoreServer;

namespace {
std::vector<char> bytes(const std::string& s) { return {s.begin(), s.end()}; }
}  // namespace

TEST_CASE("clients set and get values through the store; get waits for a later set") {
  TcpStoreServer server(0);
  REQUIRE(server.port() > 0);
  constexpr int kRanks = 6;
  std::vector<std::vector<char>> got(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  // Ranks 1.. ask first; rank 0 publishes after a delay, as bootstrap does with the NCCL id.
  for (int r = 1; r < kRanks; ++r) {
    ranks.emplace_back([&, r] {
      try {
        TcpStoreClient client("localhost", server.port(), 10.0);
        got[r] = client.get("nccl_id");
        client.set("ack/" + std::to_string(r), bytes("rank" + std::to_string(r)));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  TcpStoreClient root("127.0.0.1", server.port(), 10.0);
  std::vector<char> id(128);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 7 + 1);
  id[5] = '\0';  // binary values, zero bytes included
  root.set("nccl_id", id);
  for (auto& t : ranks) t.join();
  for (int r = 1; r < kRanks; ++r) {
    INFO("rank " << r << " error: " << errors[r]);
    CHECK(errors[r].empty());
    CHECK(got[r] == id);
    CHECK(root.get("ack/" + std::to_string(r)) == bytes("rank" + std::to_string(r)));
  }
  // Overwrite, empty values, and a get of a key already present.
  root.set("k", {});
  CHECK(root.get("k").empty());
  root.set("k", bytes("v2"));
  CHECK(root.get("k") == bytes("v2"));
}

TEST_CASE("an unreachable master is a Timeout naming host and port") {
  int port = 0;
  {
    TcpStoreServer probe(0);  // a port that was free a moment ago and is closed now
    port = probe.port();
  }
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_THROWS_QUINTET(TcpStoreClient("127.0.0.1", port, 0.5), Timeout,
                         "TCP store at 127.0.0.1:" + std::to_string(port));
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(waited >= 0.4);
  CHECK(waited < 5.0);
}

TEST_CASE("a key that is never set is a Timeout naming the key") {
  TcpStoreServer server(0);
  TcpStoreClient client("localhost", server.port(), 0.3);
  REQUIRE_THROWS_QUINTET(client.get("never"), Timeout, "key 'never'");
}

TEST_CASE("a port in use is a System error naming it") {
  TcpStoreServer first(0);
  REQUIRE_THROWS_QUINTET(TcpStoreServer second(first.port()), System,
                         "cannot listen on port " + std::to_string(first.port()));
}
