#!/bb/sh
# /init of the .ci/rxe guest: a busybox initramfs with rsock's binaries built with
# -tags rdma, rdma-core's libraries and tools, and the kernel's rxe modules. It sets up
# the Soft-RoCE devices (net.sh), runs the steps STEPS selects, prints "@@DONE" and
# powers off. The host (.ci/rxe) counts the results from the console.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin:/bb
export HOME=/root TMPDIR=/tmp GOTRACEBACK=all
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mkdir -p /dev/pts /dev/shm /var && ln -s /run /var/run
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
ulimit -l unlimited # registered memory is pinned
ulimit -n 65536
# Only critical kernel messages on the console: rxe logs an error for each QP it
# refuses (rdma-core probes the largest inline size that way), thousands in a load
# test. dmesg, filtered, is printed at the end.
echo 3 > /proc/sys/kernel/printk
# Process IDs must not wrap during a run: busybox's timeout leaves a watcher behind each
# command it starts, which checks once a second that the command's PID is alive and
# signals that PID when its time is up. With the default pid_max (32768) the Go test
# binaries' threads wrap the PIDs within minutes, and a watcher whose command ended
# could signal the new process that took its PID (a server of a later step, say).
echo 4194304 > /proc/sys/kernel/pid_max

. /ci/config
. /ci/lib.sh
. /ci/net.sh
. /ci/examples.sh
. /ci/path.sh
. /ci/perf.sh
. /ci/tls.sh
. /ci/select.sh
. /ci/mem.sh
. /ci/events.sh

echo "@@GUEST kernel $(uname -r), $(grep -c ^processor /proc/cpuinfo) CPUs, $(awk '/MemTotal/ { print $2 / 1024 " MiB" }' /proc/meminfo), up $(uptime_s) s"
echo "@@GUEST clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null) (of $(cat /sys/devices/system/clocksource/clocksource0/available_clocksource 2>/dev/null))"
echo "@@GUEST steps /$STEPS/, -test.run /$RUN/, short=$SHORT, -test.timeout ${GO_TIMEOUT}s"

load_modules() {
  local m rc=0
  for m in $(cat /modules/order); do insmod /modules/"$m" || { echo "insmod $m failed"; rc=1; }; done
  return $rc
}

# Setup: always runs (the steps below need it), and counts as a step.
STEPS_SELECTED=$STEPS
STEPS=.
cmd_step modules load_modules
cmd_step rxe_lo setup_lo
STEPS=$STEPS_SELECTED

# One device (rxe_lo only, so the suite pairs QPs on one device). TestFakeLibibverbs
# needs a C compiler, which the guest lacks; .ci/run runs it on the host. The two-host
# tests run below, in two processes.
go_step ibv_one verbs/ibv ibv "" \
  -test.skip '^(TestFakeLibibverbs|TestConformancePeerAgent|TestConformanceTwoHosts)$'
go_step auto verbs/auto auto ""

STEPS=.
cmd_step two_hosts setup_two_hosts
STEPS=$STEPS_SELECTED
cmd_step two_hosts_wire prove_wire

# The conformance suite across the two hosts: the agent on B drives its device for
# the rules that need two, the client on A runs them.
conformance_two_hosts() {
  local apid crc arc
  (
    cd /t/src/verbs/ibv || exit 1
    VERBSTEST_AGENT_LISTEN=$B:7500 timeout -k 10 $((GO_TIMEOUT + 60)) /t/bin/ibv.test -test.v \
      -test.count=1 -test.timeout="${GO_TIMEOUT}s" -test.run '^TestConformancePeerAgent$'
  ) > /tmp/agent.log 2>&1 &
  apid=$!
  wait_listen 7500 $apid || { kill $apid 2>/dev/null; wait $apid; echo "--- agent (host B):"; cat /tmp/agent.log; return 1; }
  (
    cd /t/src/verbs/ibv || exit 1
    VERBSTEST_AGENT=$B:7500 VERBSTEST_LOCAL_IP=$A timeout -k 10 $((GO_TIMEOUT + 60)) /t/bin/ibv.test \
      -test.v -test.count=1 -test.timeout="${GO_TIMEOUT}s" -test.run '^TestConformanceTwoHosts$'
  ) > /tmp/client.log 2>&1
  crc=$?
  cat /tmp/client.log
  # The agent exits once the client is done; if the client died first, do not wait long.
  timeout 60 sh -c "while kill -0 $apid 2>/dev/null; do sleep 0.5; done" || kill $apid
  wait $apid
  arc=$?
  echo "--- agent (host B):"
  cat /tmp/agent.log
  echo "client (host A) exit status $crc, agent (host B) exit status $arc"
  [ $crc = 0 ] && [ $arc = 0 ] || return 1
  grep -q -- '--- PASS: TestConformanceTwoHosts' /tmp/client.log || { echo "TestConformanceTwoHosts did not run"; return 1; }
}
if want conformance_two_hosts; then
  begin conformance_two_hosts go
  conformance_two_hosts 2>&1
  end conformance_two_hosts $?
fi

# rsock's suites over the default provider (ibv), each from its package directory.
go_step rsock rsock rsock ""
go_step rsock_internal_rdma rsock/internal/rdma rdma ""
go_step e2e internal/e2e e2e ""
go_step http http http ""
for ex in demo echo/server echo/client http/server http/client grpc/server grpc/client; do
  go_step "examples_$(echo $ex | tr / _)_test" examples/$ex ex_$(echo $ex | tr / _) ""
done

# The examples as two processes on the two hosts.
cmd_step examples_echo example_echo
cmd_step examples_http example_http
cmd_step examples_grpc example_grpc

# QUIC bootstrap across the two hosts, upgraded to RDMA with TLS (tls.sh).
cmd_step tls_two_hosts tls_two_hosts
# Device selection on a GID table with holes (select.sh).
cmd_step select_gid_holes select_gid_holes
# Registered memory against RLIMIT_MEMLOCK (mem.sh).
mem_steps
# A host's netdev taken down mid-stream (events.sh).
cmd_step events_port_down port_down_mid_stream
cmd_step events_port_down_idle port_down_idle
# RoCE filtered between the hosts: the connection falls back, nothing is lost (path.sh).
cmd_step path_filtered path_filtered

# rsockperf next to perftest and rstream, in PERF_ROUNDS rounds (see perf.sh).
: > /tmp/perf.txt
PERF_ROUND=1
while [ "$PERF_ROUND" -le "$PERF_ROUNDS" ]; do
  perf_round "$PERF_ROUND"
  PERF_ROUND=$((PERF_ROUND + 1))
done
cmd_step perf_ratios perf_ratios

if [ "$NETNS_PROBE" = 1 ]; then
  echo "@@PROBE netns (diagnostic, not counted)"
  netns_probe 2>&1
  echo "@@PROBE netns rc=$?"
fi

echo "@@GUEST rxe hw_counters"
for d in rxe_lo rxe_a rxe_b; do
  echo "$d: $(cd /sys/class/infiniband/$d/ports/1/hw_counters 2>/dev/null && for f in *; do printf '%s=%s ' "$f" "$(cat "$f")"; done)"
done
echo "@@GUEST dmesg (rxe, rdma, warnings)"
dmesg | grep -v 'rxe_create_qp: returned err = -22' | grep -iE 'rxe|rdma|infiniband|uverbs|warn|bug|error|oom|hung' | tail -60
echo "@@DONE up $(uptime_s) s"
sync
poweroff -f
