#!/usr/bin/env bash
# mpirun's launcher agent for the test hosts of scripts/netns_cluster.sh: takes ssh's place
# (mpirun --mca plm_rsh_agent scripts/netns_agent.sh) and runs the remote command inside the
# network namespace of the target host, with that host's name in its own UTS namespace.
#
#   netns_agent.sh [ssh options] HOST COMMAND...
#
# HOST is a test host's name (qnt-h2) or address (10.251.0.2). As ssh does, the words of COMMAND
# are joined with spaces and run by a shell. Exit status: the command's, or 255 (ssh's "could not
# connect") when HOST is not a test host.
set -uo pipefail

# Skip ssh-style options; the ones listed take a value.
while (($#)) && [[ "$1" == -* ]]; do
  case "$1" in
    -b | -c | -D | -E | -e | -F | -I | -i | -J | -L | -l | -m | -O | -o | -p | -Q | -R | -S | -W | -w)
      shift 2 ;;
    *) shift ;;
  esac
done
(($# >= 1)) || { echo "netns_agent: usage: netns_agent.sh [ssh options] HOST COMMAND..." >&2; exit 255; }
host=$1
shift

# The namespace: HOST itself when it names one of ours, else the host owning the address HOST.
ns=""
if [[ "$host" =~ ^qnt-h[0-9]+$ ]] && ip netns list | awk '{print $1}' | grep -qx "$host"; then
  ns=$host
else
  for candidate in $(ip netns list | awk '$1 ~ /^qnt-h[0-9]+$/ {print $1}'); do
    if ip -n "$candidate" -4 -o addr show | awk '{print $4}' | grep -q "^${host//./\\.}/"; then
      ns=$candidate
      break
    fi
  done
fi
[ -n "$ns" ] || { echo "netns_agent: '$host' is not a test host of scripts/netns_cluster.sh" >&2; exit 255; }

# unshare --uts gives the host its own hostname (what MPI_Get_processor_name and the daemons
# report) without touching the machine's.
# shellcheck disable=SC2016  # $1 and $* are the inner shell's
exec ip netns exec "$ns" unshare --uts /bin/sh -c \
  'echo "$1" >/proc/sys/kernel/hostname && shift && exec /bin/sh -c "$*"' netns_agent "$ns" "$@"
