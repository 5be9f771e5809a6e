# lib.sh: step runner and helpers for the .ci/rxe guest (busybox sh, sourced by /init).
#
# Each step prints "@@STEP BEGIN <name> kind=<go|cmd> up=<s>" and "@@STEP END <name>
# rc=<n> secs=<s>"; the host counts a go step's "--- PASS"/"--- FAIL" lines and a cmd
# step as one test. up is the guest's uptime, the clock of dmesg's timestamps, so that
# a kernel message printed at the end can be placed in its step. Every command runs under timeout(1) (coreutils: -k kills what ignores TERM).

# Debian's static busybox runs its own applets ahead of PATH: name the real tools.
# iproute2's ip (veth, rules, netns) and coreutils' timeout (-k, exit status 124).
ip() { /usr/sbin/ip "$@"; }
timeout() { /usr/bin/timeout "$@"; }

uptime_s() { cut -d' ' -f1 /proc/uptime; }

# want <name>: does STEPS select this step?
want() { echo "$1" | grep -Eq -- "$STEPS"; }

STEP_T0=0
begin() { # begin <name> <kind>
  STEP_T0=$(uptime_s)
  echo "@@STEP BEGIN $1 kind=$2 up=$STEP_T0"
}
end() { # end <name> <rc>
  echo "@@STEP END $1 rc=$2 secs=$(awk -v a="$STEP_T0" -v b="$(uptime_s)" 'BEGIN { printf "%.0f", b - a }')"
}

# go_step <name> <package dir> <binary> <-test.run pattern, "" for $RUN> [flags...]:
# runs a test binary from its package's directory in the source copy, verbose, with
# -test.timeout (a hang panics with every goroutine's stack) and timeout(1) above it.
go_step() {
  local name=$1 dir=$2 bin=$3 pat=${4:-$RUN}
  shift 4
  want "$name" || return 0
  begin "$name" go
  (
    cd "/t/src/$dir" || exit 1
    set -- -test.v -test.count=1 -test.timeout="${GO_TIMEOUT}s" "$@"
    [ "$SHORT" = 1 ] && set -- "$@" -test.short
    [ -n "$pat" ] && set -- "$@" -test.run "$pat"
    timeout -k 10 $((GO_TIMEOUT + 60)) "/t/bin/$bin.test" "$@"
  ) 2>&1
  end "$name" $?
}

# cmd_step <name> <function> [args...]: a step that is one test, passing when the
# function returns 0. The function bounds its own commands with timeout.
cmd_step() {
  local name=$1
  shift
  want "$name" || return 0
  begin "$name" cmd
  "$@" 2>&1
  end "$name" $?
}

# gid_index <device> <IPv4>: the index of the RoCE v2 GID that holds the address
# (::ffff:a.b.c.d). One grep reads the 1,024-entry table; a loop of cat takes seconds.
gid_index() {
  local suffix f i
  suffix=$(echo "$2" | awk -F. '{ printf "ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
  for f in $(grep -l "$suffix\$" /sys/class/infiniband/"$1"/ports/1/gids/* 2>/dev/null); do
    i=${f##*/}
    case $(cat /sys/class/infiniband/"$1"/ports/1/gid_attrs/types/"$i" 2>/dev/null) in
      *v2*) echo "$i"; return 0 ;;
    esac
  done
  return 1
}

# ctr <device> <counter>: one of rxe's hw_counters (sent_pkts, rcvd_pkts, ...).
ctr() { cat /sys/class/infiniband/"$1"/ports/1/hw_counters/"$2"; }
# netctr <netdev> <rx|tx>: packets through a network interface.
netctr() { cat /sys/class/net/"$1"/statistics/"$2"_packets; }

# wait_listen <port> [pid]: until something listens on the TCP port (IPv4 or IPv6), for
# at most 30 s, or until process pid, the server expected to listen, has exited.
wait_listen() {
  local hex n
  hex=$(printf '%04X' "$1")
  n=0
  while [ $n -lt 150 ]; do
    cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p=":$hex" '$2 ~ p"$" && $4 == "0A" { f = 1 } END { exit !f }' && return 0
    if [ -n "$2" ] && ! kill -0 "$2" 2>/dev/null; then
      echo "the server exited without listening on port $1"
      return 1
    fi
    sleep 0.2
    n=$((n + 1))
  done
  echo "nothing listens on port $1 after 30 s"
  return 1
}

# children <pid>: the processes whose parent is pid (field 4 of /proc/<pid>/stat, after
# the command name, which may hold spaces).
children() {
  cat /proc/[0-9]*/stat 2>/dev/null | awk -v p="$1" '{ s = $0; sub(/^[0-9]+ \(.*\) /, "", s); split(s, f, " "); if (f[2] == p) print $1 }'
}

# stop <pid> <label>: SIGTERM a background server, wait for it and say how it ended.
# A server that had ended before it was stopped (it died, or something else signalled
# it) is a failure, said as such. pid is the timeout(1) that runs the server; the
# signal goes to the server too, because timeout did not pass it on in the guest: its
# servers went on listening, idle, through every later step. A server still running
# 10 s after the signal is killed, and that is a failure too.
stop() {
  local rc kids k n
  if ! kill -0 "$1" 2>/dev/null; then
    wait "$1"
    echo "$2 had already ended (status $?) before it was stopped"
    return 1
  fi
  kids=$(children "$1")
  kill -TERM $kids "$1" 2>/dev/null
  rc=0
  for k in $kids; do
    n=0
    while kill -0 "$k" 2>/dev/null && [ $n -lt 50 ]; do
      sleep 0.2
      n=$((n + 1))
    done
    if kill -0 "$k" 2>/dev/null; then
      echo "$2 (pid $k) was still running 10 s after SIGTERM: killed"
      kill -KILL "$k" 2>/dev/null
      rc=1
    fi
  done
  wait "$1"
  k=$?
  # 143: it ended on the SIGTERM itself; a Go program that handles it exits 0.
  [ $k = 143 ] && k=0
  [ $k = 0 ] || { echo "$2 exited with status $k"; rc=1; }
  return $rc
}
