// whoami: where each rank of a multi-node job thinks it is, as quintet::init sees it.
//
//   mpirun --hostfile hosts -np 4 whoami
//
// Rank 0 prints one line per rank, in rank order:
//   whoami rank=2 size=4 local_rank=0 local_size=2 host=qnt-h2 addr=10.251.0.2
// host is the node's hostname, addr its IPv4 addresses other than loopback (comma-separated).
// It checks what the launcher claims against what the ranks find together: ranks with the same
// hostname must hold local ranks 0..local_size-1 (in rank order) and agree on local_size, and a
// world all-reduce must give the sum of the ranks. Exit status 1 (on every rank) when not.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <string>
#include <vector>

#include "quintet/collectives/bootstrap.hpp"
#include "quintet/core/tensor.hpp"

namespace {

constexpr int kField = 128;  // bytes per rank for hostname and addresses

std::string hostname() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  return name;
}

// The IPv4 addresses of this network namespace, loopback excluded.
std::string addresses() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "?";
  std::string out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    if (std::strncmp(text, "127.", 4) == 0) continue;
    out += (out.empty() ? "" : ",") + std::string(text);
  }
  freeifaddrs(list);
  return out.empty() ? "-" : out;
}

// Every rank's text, gathered to every rank (kField bytes each, NUL-padded).
std::vector<std::string> all_gather_text(quintet::Communicator& comm, const std::string& text) {
  std::vector<std::uint8_t> mine(kField, 0);
  std::memcpy(mine.data(), text.data(), std::min<std::size_t>(text.size(), kField - 1));
  quintet::Tensor in = quintet::Tensor::from_vector(mine, {kField});
  quintet::Tensor out = quintet::Tensor::zeros({kField * comm.size()}, quintet::DType::u8);
  comm.all_gather(in, out).synchronize();
  const std::vector<std::uint8_t> all = out.to_vector<std::uint8_t>();
  std::vector<std::string> texts;
  for (int r = 0; r < comm.size(); ++r) {
    texts.emplace_back(reinterpret_cast<const char*>(all.data() + r * kField));
  }
  return texts;
}

}  // namespace

int main(int argc, char** argv) try {
  quintet::World world = quintet::init(argc, argv);
  quintet::Communicator& comm = world.cpu_comm();
  const std::vector<std::string> hosts = all_gather_text(comm, hostname());
  const std::vector<std::string> addrs = all_gather_text(comm, addresses());
  const std::vector<std::string> locals = all_gather_text(
      comm, std::to_string(world.local_rank()) + " " + std::to_string(world.local_size()));

  // Expected local rank = position among the ranks of the same host; local size = their count.
  std::map<std::string, int> per_host;
  for (const std::string& h : hosts) ++per_host[h];
  std::map<std::string, int> seen;
  int errors = 0;
  for (int r = 0; r < world.size(); ++r) {
    int local_rank = -1, local_size = -1;
    std::sscanf(locals[r].c_str(), "%d %d", &local_rank, &local_size);
    const int want_rank = seen[hosts[r]]++;
    if (local_rank != want_rank || local_size != per_host[hosts[r]]) {
      ++errors;
      if (world.rank() == 0) {
        std::fprintf(stderr,
                     "whoami: rank %d on %s has local_rank %d, local_size %d; expected %d, %d\n", r,
                     hosts[r].c_str(), local_rank, local_size, want_rank, per_host[hosts[r]]);
      }
    }
    if (world.rank() == 0) {
      std::printf("whoami rank=%d size=%d local_rank=%d local_size=%d host=%s addr=%s\n", r,
                  world.size(), local_rank, local_size, hosts[r].c_str(), addrs[r].c_str());
    }
  }

  quintet::Tensor x = quintet::Tensor::full({1}, world.rank(), quintet::DType::f64);
  comm.all_reduce(x).synchronize();
  const double want = world.size() * (world.size() - 1) / 2.0;
  if (x.to_vector<double>()[0] != want) {
    ++errors;
    std::fprintf(stderr, "whoami: rank %d: all_reduce of the ranks gave %g, expected %g\n",
                 world.rank(), x.to_vector<double>()[0], want);
  }
  if (world.rank() == 0 && errors == 0) std::printf("whoami: ok\n");
  std::fflush(stdout);
  return errors == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "whoami: %s\n", e.what());
  return 1;
}
