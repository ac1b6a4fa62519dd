#include "collectives/tcp_store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>

#include "quintet/core/error.hpp"

namespace quintet::detail {

namespace {

// Wire format (little-endian host order: both ends run this code):
//   request  = u8 command ('S' set / 'G' get), u32 key length, key, and for 'S': u64 length, value
//   response = for 'S': u8 1; for 'G': u64 length, value (sent once the key exists)
constexpr char kSet = 'S';
constexpr char kGet = 'G';
constexpr std::uint32_t kMaxKey = 1u << 16;
constexpr std::uint64_t kMaxValue = 1ull << 30;

using Clock = std::chrono::steady_clock;

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return static_cast<int>(std::max<std::int64_t>(0, left.count()));
}

bool write_fully(int fd, const void* data, std::size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<std::size_t>(k);
  }
  return true;
}

// One connected client as the server sees it: bytes received so far, parsed as they complete.
struct Connection {
  std::string buffer;
};

// Parses one complete request from the front of buf; returns false when more bytes are needed.
bool parse_request(std::string& buf, char& cmd, std::string& key, std::string& value, bool& bad) {
  bad = false;
  if (buf.size() < 5) return false;
  cmd = buf[0];
  std::uint32_t klen;
  std::memcpy(&klen, buf.data() + 1, 4);
  if ((cmd != kSet && cmd != kGet) || klen > kMaxKey) {
    bad = true;
    return false;
  }
  std::size_t need = 5 + klen;
  std::uint64_t vlen = 0;
  if (cmd == kSet) {
    if (buf.size() < need + 8) return false;
    std::memcpy(&vlen, buf.data() + need, 8);
    if (vlen > kMaxValue) {
      bad = true;
      return false;
    }
    need += 8 + vlen;
  }
  if (buf.size() < need) return false;
  key.assign(buf, 5, klen);
  if (cmd == kSet) value.assign(buf, 5 + klen + 8, vlen);
  buf.erase(0, need);
  return true;
}

bool reply_value(int fd, const std::string& value) {
  const std::uint64_t n = value.size();
  return write_fully(fd, &n, 8) && write_fully(fd, value.data(), value.size());
}

}  // namespace

TcpStoreServer::TcpStoreServer(int port) {
  listen_fd_ = ::socket(AF_INET6, SOCK_STREAM, 0);
  const bool v6 = listen_fd_ >= 0;
  if (!v6) listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (listen_fd_ < 0) QUINTET_THROW(System, "TCP store: socket() failed: {}", std::strerror(errno));
  int one = 1, zero = 0;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  int rc;
  if (v6) {
    ::setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);  // also IPv4
    sockaddr_in6 addr{};
    addr.sin6_family = AF_INET6;
    addr.sin6_addr = in6addr_any;
    addr.sin6_port = htons(static_cast<std::uint16_t>(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  } else {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_ANY);
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    rc = ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  }
  if (rc != 0 || ::listen(listen_fd_, 1024) != 0) {
    const int err = errno;
    ::close(listen_fd_);
    QUINTET_THROW(System,
                  "TCP store: cannot listen on port {}: {}; pick a free MASTER_PORT (the port "
                  "rank 0 serves the store on)",
                  port, std::strerror(err));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  port_ = ntohs(v6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
}

void TcpStoreServer::serve() {
  std::map<int, Connection> clients;
  std::map<std::string, std::string> store;
  std::multimap<std::string, int> waiting;  // key -> client waiting for it
  auto drop = [&](int fd) {
    ::close(fd);
    clients.erase(fd);
    for (auto it = waiting.begin(); it != waiting.end();) {
      it = it->second == fd ? waiting.erase(it) : std::next(it);
    }
  };
  while (!stop_) {
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    for (const auto& [fd, c] : clients) fds.push_back({fd, POLLIN, 0});
    // The timeout bounds how long destruction waits for the loop to notice stop_.
    if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
    if (fds[0].revents & POLLIN) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd >= 0) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        clients[fd] = Connection{};
      }
    }
    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      const int fd = fds[i].fd;
      char chunk[4096];
      const ssize_t k = ::recv(fd, chunk, sizeof chunk, 0);
      if (k <= 0) {
        drop(fd);
        continue;
      }
      std::string& buf = clients[fd].buffer;
      buf.append(chunk, static_cast<std::size_t>(k));
      char cmd;
      std::string key, value;
      bool bad = false, ok = true;
      while (ok && parse_request(buf, cmd, key, value, bad)) {
        if (cmd == kSet) {
          store[key] = value;
          const char ack = 1;
          ok = write_fully(fd, &ack, 1);
          auto [lo, hi] = waiting.equal_range(key);
          for (auto it = lo; it != hi; ++it) reply_value(it->second, value);
          waiting.erase(lo, hi);
        } else if (auto it = store.find(key); it != store.end()) {
          ok = reply_value(fd, it->second);
        } else {
          waiting.emplace(key, fd);
        }
      }
      if (bad || !ok) drop(fd);
    }
  }
  for (const auto& [fd, c] : clients) ::close(fd);
}

TcpStoreClient::TcpStoreClient(const std::string& host, int port, double timeout_s)
    : host_(host), port_(port), timeout_s_(timeout_s) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  std::string last_error = "no attempt made";
  do {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(port);
    const int gai = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
    if (gai != 0) {
      last_error = fmt::format("cannot resolve '{}': {}", host, ::gai_strerror(gai));
    }
    for (addrinfo* a = found; a != nullptr && fd_ < 0; a = a->ai_next) {
      const int fd = ::socket(a->ai_family, a->ai_socktype, a->ai_protocol);
      if (fd < 0) continue;
      // Non-blocking connect, so an unroutable address cannot block past the deadline.
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
      int err = ::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
      if (err == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        if (::poll(&p, 1, std::max(1, remaining_ms(deadline))) == 1) {
          socklen_t len = sizeof err;
          ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
      if (err == 0) {
        ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        fd_ = fd;
      } else {
        last_error = std::strerror(err);
        ::close(fd);
      }
    }
    if (found != nullptr) ::freeaddrinfo(found);
    if (fd_ >= 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, remaining_ms(deadline))));
  } while (Clock::now() < deadline);
  QUINTET_THROW(Timeout,
                "could not connect to the TCP store at {}:{} (MASTER_ADDR:MASTER_PORT) within "
                "{} s (last error: {}); check that rank 0 is running and that every rank has the "
                "same MASTER_ADDR and MASTER_PORT, reachable from this host",
                host, port, timeout_s, last_error);
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

void TcpStoreClient::send_all(const void* data, std::size_t n) {
  if (!write_fully(fd_, data, n)) {
    QUINTET_THROW(System, "TCP store at {}:{}: send failed: {} (did rank 0 exit?)", host_, port_,
                  std::strerror(errno));
  }
}

void TcpStoreClient::recv_all(void* data, std::size_t n, const std::string& waiting_for) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s_));
  char* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd_, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, remaining_ms(deadline));
    if (ready == 0) {
      QUINTET_THROW(Timeout,
                    "TCP store at {}:{}: no answer within {} s while waiting for {}; rank 0 has "
                    "not published it (is rank 0 running, and past its own initialisation?)",
                    host_, port_, timeout_s_, waiting_for);
    }
    if (ready < 0 && errno == EINTR) continue;
    const ssize_t k = ready < 0 ? -1 : ::recv(fd_, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) {
      QUINTET_THROW(System, "TCP store at {}:{}: connection closed while waiting for {}", host_,
                    port_, waiting_for);
    }
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void TcpStoreClient::set(const std::string& key, const std::vector<char>& value) {
  QUINTET_CHECK(key.size() <= kMaxKey && value.size() <= kMaxValue,
                "TCP store set: key of {} bytes / value of {} bytes; limits are {} / {}",
                key.size(), value.size(), kMaxKey, kMaxValue);
  std::string msg(1, kSet);
  const auto klen = static_cast<std::uint32_t>(key.size());
  const std::uint64_t vlen = value.size();
  msg.append(reinterpret_cast<const char*>(&klen), 4).append(key);
  msg.append(reinterpret_cast<const char*>(&vlen), 8).append(value.data(), value.size());
  send_all(msg.data(), msg.size());
  char ack = 0;
  recv_all(&ack, 1, fmt::format("the acknowledgement of set('{}')", key));
}

std::vector<char> TcpStoreClient::get(const std::string& key) {
  QUINTET_CHECK(key.size() <= kMaxKey, "TCP store get: key of {} bytes; the limit is {}",
                key.size(), kMaxKey);
  std::string msg(1, kGet);
  const auto klen = static_cast<std::uint32_t>(key.size());
  msg.append(reinterpret_cast<const char*>(&klen), 4).append(key);
  send_all(msg.data(), msg.size());
  const std::string what = fmt::format("key '{}'", key);
  std::uint64_t n = 0;
  recv_all(&n, 8, what);
  std::vector<char> value(n);
  if (n > 0) recv_all(value.data(), n, what);
  return value;
}

}  // namespace quintet::detail
