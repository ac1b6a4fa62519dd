#!/usr/bin/env bash
# A pretend cluster on one Linux machine, for testing multi-node mpirun jobs for real: every test
# host is a network namespace with its own address, hostname and loopback, and mpirun starts its
# daemons on them through a launcher agent (scripts/netns_agent.sh) instead of ssh.
#
#   scripts/netns_cluster.sh up N [SLOTS]   make hosts qnt-h1..qnt-hN (SLOTS slots each, default 2)
#   scripts/netns_cluster.sh down           remove everything `up` made (also leftovers)
#   scripts/netns_cluster.sh status         list the hosts and their addresses
#   scripts/netns_cluster.sh exec CMD...    run CMD on the head node (where mpirun runs)
#   scripts/netns_cluster.sh mpirun ARGS... mpirun on the head node with the hostfile, the agent
#                                           and MPI restricted to the test subnet
#
# The layout (subnet 10.251.0.0/24, override the first three octets with QUINTET_NETNS_NET):
#
#   qnt-head  (mpirun runs here)          qnt-h1                 qnt-h2  ...
#     qntbr0 bridge, 10.251.0.254 ------- eth0 10.251.0.1 ------ eth0 10.251.0.2
#       qnt-v1, qnt-v2, ... (veth ends)
#
# Nothing is added to the root namespace: the bridge sits in the head namespace, so the machine's
# own interfaces, routes and firewall are untouched. Host names resolve through per-namespace
# hosts files (/etc/netns/<ns>/hosts, which `ip netns exec` mounts over /etc/hosts), so the
# hostfile names hosts as on a real cluster and /etc/hosts is not edited. mpirun must run in
# qnt-head: there none of the host addresses is local, so OpenMPI launches every host through
# the agent (run from the root namespace, it would see no route to the hosts at all).
#
# State (hostfile, mpirun flags) lives in $QUINTET_NETNS_DIR (default /tmp/quintet-netns).
# Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN) and iproute2; where namespaces cannot be made it
# says so and exits 77 (the ctest skip code).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
agent="$here/netns_agent.sh"
net=${QUINTET_NETNS_NET:-10.251.0}
subnet="$net.0/24"
state=${QUINTET_NETNS_DIR:-/tmp/quintet-netns}
head=qnt-head
bridge=qntbr0
head_ip="$net.254"

die() {
  echo "netns_cluster: $*" >&2
  exit 1
}
skip() {
  echo "netns_cluster: SKIP: $*" >&2
  exit 77
}

# Our namespaces, hosts first (ip netns list prints "name (id: N)").
our_namespaces() { ip netns list 2>/dev/null | awk '$1 ~ /^qnt-h[0-9]+$/ {print $1}' | sort -V; }

check_can_make() {
  command -v ip >/dev/null 2>&1 || skip "'ip' (iproute2) is not installed; scripts/setup.sh installs it"
  command -v unshare >/dev/null 2>&1 || skip "'unshare' (util-linux) is not installed"
  [ "$(id -u)" = 0 ] || skip "network namespaces need root (running as uid $(id -u))"
  # A probe namespace: fails without CAP_NET_ADMIN/CAP_SYS_ADMIN (e.g. an unprivileged container).
  ip netns del qnt-probe >/dev/null 2>&1 || true
  if ! ip netns add qnt-probe >/dev/null 2>&1; then
    skip "cannot create network namespaces here (no CAP_NET_ADMIN/CAP_SYS_ADMIN?)"
  fi
  if ! ip -n qnt-probe link add qnt-probebr type bridge >/dev/null 2>&1 ||
    ! ip -n qnt-probe link add qnt-probev type veth peer name qnt-probew >/dev/null 2>&1; then
    ip netns del qnt-probe >/dev/null 2>&1 || true
    skip "cannot create bridge or veth interfaces here (kernel modules missing?)"
  fi
  if ! ip netns exec qnt-probe unshare --uts /bin/true >/dev/null 2>&1; then
    ip netns del qnt-probe >/dev/null 2>&1 || true
    skip "cannot run a process in a new network and UTS namespace here (no CAP_SYS_ADMIN?)"
  fi
  ip netns del qnt-probe
}

# Kills the processes still inside one of our namespaces (a daemon of an aborted job), by pid.
kill_inside() {
  local ns=$1 pids=()
  mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
  ((${#pids[@]})) || return 0
  echo "netns_cluster: killing processes left in $ns: ${pids[*]}" >&2
  kill "${pids[@]}" 2>/dev/null || true
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    ((${#pids[@]})) || return 0
    sleep 0.2
  done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

cmd_down() {
  local ns
  for ns in $(our_namespaces) $(ip netns list 2>/dev/null | awk '$1 == "qnt-head" || $1 == "qnt-probe" {print $1}'); do
    kill_inside "$ns"
    ip netns del "$ns" 2>/dev/null || true  # its interfaces (veth ends, bridge) go with it
    rm -rf "/etc/netns/$ns"
  done
  rmdir /etc/netns 2>/dev/null || true  # only if we were its last user
  rm -rf "$state"
}

cmd_up() {
  local n=${1:-}
  local slots=${2:-2}
  if ! [[ "$n" =~ ^[0-9]+$ ]] || ((n < 1 || n > 200)); then
    die "up: expected a host count 1..200, got '$n'"
  fi
  if ! [[ "$slots" =~ ^[0-9]+$ ]] || ((slots < 1)); then die "up: expected SLOTS >= 1, got '$slots'"; fi
  check_can_make
  cmd_down

  mkdir -p "$state"
  # Hosts file for every namespace: the machine's own entries (localhost) plus the test hosts.
  local hosts="$state/hosts"
  grep -v -E "\\bqnt-(head|h[0-9]+)\\b" /etc/hosts >"$hosts" || true
  echo "$head_ip $head" >>"$hosts"
  local i
  for ((i = 1; i <= n; i++)); do echo "$net.$i qnt-h$i" >>"$hosts"; done

  ip netns add "$head"
  ip -n "$head" link set lo up
  ip -n "$head" link add "$bridge" type bridge
  ip -n "$head" addr add "$head_ip/24" dev "$bridge"
  ip -n "$head" link set "$bridge" up
  mkdir -p "/etc/netns/$head"
  cp "$hosts" "/etc/netns/$head/hosts"

  : >"$state/hostfile"
  for ((i = 1; i <= n; i++)); do
    local ns="qnt-h$i"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    # One veth pair: qnt-v$i on the bridge in the head namespace, eth0 in the host.
    ip -n "$head" link add "qnt-v$i" type veth peer name eth0 netns "$ns"
    ip -n "$head" link set "qnt-v$i" master "$bridge"
    ip -n "$head" link set "qnt-v$i" up
    ip -n "$ns" addr add "$net.$i/24" dev eth0
    ip -n "$ns" link set eth0 up
    mkdir -p "/etc/netns/$ns"
    cp "$hosts" "/etc/netns/$ns/hosts"
    echo "qnt-h$i slots=$slots" >>"$state/hostfile"
  done

  # The mpirun flags that make a job use these hosts and only the test subnet; no tree spawn, so
  # the head launches every daemon itself.
  cat >"$state/mpirun.args" <<EOF
--hostfile $state/hostfile
--mca plm_rsh_agent $agent
--mca plm_rsh_no_tree_spawn 1
--mca btl tcp,self
--mca btl_tcp_if_include $subnet
--mca oob_tcp_if_include $subnet
EOF

  # Every host's link must be up and its bridge port forwarding before a job starts on it (no
  # STP, so this takes at most a moment).
  for ((i = 1; i <= n; i++)); do
    local ok=0
    for _ in $(seq 1 50); do
      if ip -n "qnt-h$i" link show eth0 | grep -q "state UP" &&
        ip -n "$head" -d link show "qnt-v$i" | grep -q "state forwarding"; then
        ok=1
        break
      fi
      sleep 0.1
    done
    ((ok)) || { cmd_down; die "host qnt-h$i: link eth0 did not come up"; }
  done
  echo "netns_cluster: up: $n hosts x $slots slots on $subnet; hostfile $state/hostfile"
}

cmd_status() {
  local ns
  for ns in $(our_namespaces); do
    echo "$ns $(ip -n "$ns" -4 -o addr show dev eth0 | awk '{print $4}')"
  done
  [ -f "$state/hostfile" ] && echo "hostfile: $state/hostfile" || echo "no cluster is up"
}

cmd_exec() {
  ip netns list 2>/dev/null | grep -q "^$head\\b" || die "no cluster is up; run: $0 up N"
  exec ip netns exec "$head" "$@"
}

cmd_mpirun() {
  [ -f "$state/mpirun.args" ] || die "no cluster is up; run: $0 up N"
  local args=()
  mapfile -t args < <(tr ' ' '\n' <"$state/mpirun.args" | sed '/^$/d')
  local root=()
  [ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
  cmd_exec mpirun "${root[@]}" "${args[@]}" "$@"
}

case "${1:-}" in
  up) shift; cmd_up "$@" ;;
  down) cmd_down ;;
  status) cmd_status ;;
  exec) shift; cmd_exec "$@" ;;
  mpirun) shift; cmd_mpirun "$@" ;;
  *)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
esac
