// A small key-value store over TCP, used by bootstrap to exchange the NCCL unique id when ranks
// are launched with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (torchrun style) instead of mpirun.
//
// Rank 0 runs a TcpStoreServer; every rank (rank 0 included) talks to it with a TcpStoreClient.
// get() waits until some client has set the key. Values are bytes. Every wait is bounded by the
// client's timeout, so an unreachable master is a Timeout error naming host:port, never a hang.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace quintet::detail {

class TcpStoreServer {
 public:
  // Listens on every interface at port (0: an ephemeral port, see port()). Throws System when
  // the port cannot be bound, naming it.
  explicit TcpStoreServer(int port);
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  ~TcpStoreServer();  // stops the server thread; never throws

  int port() const { return port_; }

 private:
  void serve();

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying until timeout_s (the server may start later). Throws Timeout
  // naming host:port when no connection is made in time.
  TcpStoreClient(const std::string& host, int port, double timeout_s);
  TcpStoreClient(const TcpStoreClient&) = delete;
  TcpStoreClient& operator=(const TcpStoreClient&) = delete;
  ~TcpStoreClient();

  void set(const std::string& key, const std::vector<char>& value);
  // Waits until key is set (by any client), up to the timeout given at construction.
  std::vector<char> get(const std::string& key);

 private:
  void send_all(const void* data, std::size_t n);
  void recv_all(void* data, std::size_t n, const std::string& waiting_for);

  std::string host_;
  int port_;
  double timeout_s_;
  int fd_ = -1;
};

}  // namespace quintet::detail
