# perf.sh: rsockperf next to perftest and rsockets, server on host B, client on host A,
# in one boot (busybox sh, sourced by /init). The VM is emulated: only ratios within a
# boot mean anything, and even those swing by a quarter or more from one minute to the
# next (the same build's stream measured 0.66× and 1.01× of ib_write_bw in two boots).
# So init runs every tool once per round, PERF_ROUNDS rounds one after the other, each
# tool's run a step, and within a round a measure's tools back to back, rsock between
# its two references (perf_round): each round's ratio is taken between runs seconds
# apart. The figures land in /tmp/perf.txt as "<tool> <measure> <value> <round>" (MB/s
# for throughput, 10^6 bytes; µs for round trips), and perf_ratios prints the median
# over the rounds of rsock/perftest and rsock/rstream as "@@RATIO" lines.
#
# Measures: stream of 64 KiB and 4 KiB writes (throughput), 64 B ping-pong (round trip).
#   perftest: ib_write_bw's "BW average" (MiB/s, converted) and ib_write_lat's t_typical
#     (its median, half a round trip: doubled).
#   rstream: -C transfers one way then back, per iteration; usec/xfer is the whole time
#     over all the transfers, so a stream's MB/s is the transfer size over usec/xfer. Its
#     Gb/sec column would do too, but it prints two decimals: at the VM's 10 MB/s (0.08
#     Gb/sec) that is a step of 1.25 MB/s, and the 4 KiB figure read 7.5 or 10.0 MB/s
#     for runs of 7.2 to 10.8 (up to 7% off). usec/xfer with -C 1 is half a round trip:
#     doubled.
#   rsockperf: RsockRDMA, stream MB/s and pingpong p50 (a round trip), with the default
#     polling (Config.PollSpin: a short spin, then sleep on the completion channel); and
#     the 64 B pingpong again in spinning mode (rtt_64B_spin: -spin 100000 on both sides,
#     so that a waiting Read polls the CQ for the whole round trip), which is how
#     ib_write_lat and rstream wait (they busy-poll). rtt_64B_spin is compared with their
#     rtt_64B.
#   ibv_rc_pingpong -e: a 64 B round trip ("usec/iter") with both sides sleeping on the
#     completion channel for every completion, as rsock's default mode does once its
#     spin runs out; rsock's rtt_64B is compared with it as rtt_64B_event.

PERF_ROUND=1 # set by init's loop
record() { echo "$1 $2 $3 $PERF_ROUND" >> /tmp/perf.txt; echo "figure: $1 $2 $3 (round $PERF_ROUND)"; }

# perftest_once <tool> <measure> <args...>: one perftest pair on rxe_b / rxe_a; status 2
# when the figure it printed is not finite.
perftest_once() {
  local tool=$1 measure=$2 ga gb spid crc src v
  shift 2
  ga=$(gid_index rxe_a $A) && gb=$(gid_index rxe_b $B) || return 1
  timeout -k 5 120 "$tool" -d rxe_b -x "$gb" -F "$@" > /tmp/pt_s.log 2>&1 &
  spid=$!
  wait_listen 18515 $spid || { kill $spid 2>/dev/null; cat /tmp/pt_s.log; return 1; }
  timeout -k 5 120 "$tool" -d rxe_a -x "$ga" -F "$@" $B > /tmp/pt_c.log 2>&1
  crc=$?
  wait $spid
  src=$?
  cat /tmp/pt_c.log
  [ $crc = 0 ] && [ $src = 0 ] || { echo "--- server:"; cat /tmp/pt_s.log; echo "client $crc, server $src"; return 1; }
  case $tool in
    ib_write_bw) v=$(awk '$1 ~ /^[0-9]+$/ && NF >= 5 { printf "%.1f", $4 * 1.048576 }' /tmp/pt_c.log) ;;
    ib_write_lat) v=$(awk '$1 ~ /^[0-9]+$/ && NF >= 6 { printf "%.2f", $5 * 2 }' /tmp/pt_c.log) ;;
  esac
  [ -n "$v" ] || { echo "no figure in $tool's output"; return 1; }
  case $v in
    *inf*|*nan*) echo "no finite figure in $tool's output ($v)"; return 2 ;;
  esac
  # A failed calibration makes the clock rate 0: latencies inf, bandwidths 0.
  grep -q 'Correlation coefficient r^2' /tmp/pt_c.log && [ "$(awk -v v="$v" 'BEGIN { print (v + 0 > 0) }')" = 0 ] && {
    echo "no figure in $tool's output: its clock calibration failed ($v)"; return 2; }
  record perftest "$measure" "$v"
}

# perftest: perftest_once, again (up to three tries) when the tool printed inf or a
# bandwidth of 0: it times with the cycle counter, and when its calibration of the
# counter against the clock fails (r^2 < 0.9, which an emulated CPU on a busy host can
# give), every time it prints is inf and every bandwidth 0.00. After three, the figure is
# recorded as "-" (not measured), which perf_ratios prints as such rather than as a ratio.
perftest() {
  local try=1 rc
  while :; do
    perftest_once "$@"
    rc=$?
    [ $rc = 2 ] || return $rc
    [ $try -lt 3 ] || { record perftest "$2" -; return 0; }
    try=$((try + 1))
    echo "perftest: calibration failed, try $try"
  done
}

# rcpingpong_run <measure> <args...>: an ibv_rc_pingpong pair on rxe_b / rxe_a with -e:
# each side sleeps on its CQ's completion channel for every completion, as rsock's
# default mode ends up doing after its short spin. It is the blocking C reference for
# rtt_64B; perftest and rstream busy-poll. Its "usec/iter" is one round trip.
rcpingpong_run() {
  local measure=$1 ga gb spid crc src v
  shift
  ga=$(gid_index rxe_a $A) && gb=$(gid_index rxe_b $B) || return 1
  timeout -k 5 120 ibv_rc_pingpong -d rxe_b -g "$gb" -p 18520 -e "$@" > /tmp/rc_s.log 2>&1 &
  spid=$!
  wait_listen 18520 $spid || { kill $spid 2>/dev/null; cat /tmp/rc_s.log; return 1; }
  timeout -k 5 120 ibv_rc_pingpong -d rxe_a -g "$ga" -p 18520 -e "$@" $B > /tmp/rc_c.log 2>&1
  crc=$?
  wait $spid
  src=$?
  cat /tmp/rc_c.log
  [ $crc = 0 ] && [ $src = 0 ] || { echo "--- server:"; cat /tmp/rc_s.log; echo "client $crc, server $src"; return 1; }
  v=$(awk '/usec\/iter/ { for (i = 1; i < NF; i++) if ($(i + 1) == "usec/iter") printf "%.2f", $i }' /tmp/rc_c.log)
  [ -n "$v" ] || { echo "no figure in ibv_rc_pingpong's output"; return 1; }
  record rcpingpong "$measure" "$v"
}

# transfer_size <args...>: the value of rstream's -S among args.
transfer_size() {
  while [ $# -gt 1 ]; do
    [ "$1" = -S ] && { echo "$2"; return; }
    shift
  done
}

RSPORT=7470
# rstream_run <measure> <args...>: an rstream pair, client bound to A.
rstream_run() {
  local measure=$1 spid crc src v size
  shift
  RSPORT=$((RSPORT + 1))
  timeout -k 5 150 rstream -f ip -b $B -p $RSPORT "$@" > /tmp/rs_s.log 2>&1 &
  spid=$!
  # An rsockets listener is an rdma_cm endpoint, not a kernel TCP socket: wait_listen
  # cannot see it. The client retries while the server is up and nothing was sent.
  local try=0
  while :; do
    sleep 2
    timeout -k 5 120 rstream -f ip -s $B -b $A -p $RSPORT "$@" > /tmp/rs_c.log 2>&1
    crc=$?
    try=$((try + 1))
    [ $crc != 0 ] && [ $try -lt 5 ] && kill -0 $spid 2>/dev/null && ! grep -q usec /tmp/rs_c.log || break
    echo "rstream client attempt $try: status $crc, retrying: $(cat /tmp/rs_c.log)"
  done
  wait $spid
  src=$?
  cat /tmp/rs_c.log
  [ $crc = 0 ] && [ $src = 0 ] || { echo "--- server:"; cat /tmp/rs_s.log; echo "client $crc, server $src"; return 1; }
  case $measure in
    rtt*) v=$(awk '$NF ~ /^[0-9.]+$/ && NF >= 8 { printf "%.2f", $NF * 2 }' /tmp/rs_c.log) ;;
    *)
      size=$(transfer_size "$@")
      [ -n "$size" ] || { echo "rstream_run $measure: no -S among the arguments"; return 1; }
      v=$(awk -v size="$size" '$NF ~ /^[0-9.]+$/ && NF >= 8 && $NF > 0 { printf "%.2f", size / $NF }' /tmp/rs_c.log) ;;
  esac
  [ -n "$v" ] || { echo "no figure in rstream's output"; return 1; }
  record rstream "$measure" "$v"
}

# rsockperf_run <measure> <workload> <size> [flags...]: one server and one client
# process, RsockRDMA, one workload at one size, the figure recorded as <measure> (stream:
# MB/s; pingpong: its p50, a round trip, in µs). flags go to both sides (-spin 100000
# for rtt_64B_spin). Each run listens on a port of its own.
RPPORT=7100
rsockperf_run() {
  local measure=$1 workload=$2 size=$3 spid crc src v
  shift 3
  RPPORT=$((RPPORT + 1))
  timeout -k 5 300 /t/bin/rsockperf -mode server -addr $B:$RPPORT -transports RsockRDMA "$@" > /tmp/rp_s.log 2>&1 &
  spid=$!
  wait_listen $RPPORT $spid || { kill $spid 2>/dev/null; cat /tmp/rp_s.log; return 1; }
  timeout -k 5 240 /t/bin/rsockperf -mode client -q -addr $B:$RPPORT -transports RsockRDMA "$@" \
    -workloads "$workload" -sizes "$size" -duration "${PERF_SECS}s" > /tmp/rp_c.log 2>&1
  crc=$?
  stop $spid rsockperf-server
  src=$?
  cat /tmp/rp_c.log
  [ $crc = 0 ] && [ $src = 0 ] || { echo "--- server:"; cat /tmp/rp_s.log; echo "client $crc, server $src"; return 1; }
  # The text table: a "<workload>:" section, rows "<size> RsockRDMA <figure> ...".
  v=$(awk -v w="$workload:" '
    $1 == w { in_w = 1; next } /^[a-z]+:$/ { in_w = 0 }
    in_w && $2 == "RsockRDMA" {
      v = $3; u = 1
      if (v ~ /ns$/) { u = 0.001 } else if (v ~ /ms$/) { u = 1000 } else if (v ~ /µs$/ || v ~ /us$/) { u = 1 } else if (v ~ /[0-9]s$/) { u = 1000000 }
      gsub(/[^0-9.]/, "", v); printf "%.2f", v * u; exit
    }' /tmp/rp_c.log)
  [ -n "$v" ] || { echo "missing rsockperf figure"; return 1; }
  record rsock "$measure" "$v"
}

# perf_round <r>: one round. Each measure's tools run back to back, rsock between its
# references, so that a round's ratio compares runs seconds apart rather than a minute
# (the host's speed drifts over minutes: see the header); the references' order
# alternates from round to round, so that a drift within the group favours neither.
perf_round() {
  local r=_r$1 first=perftest
  [ $(($1 % 2)) = 0 ] && first=rstream
  perf_group "$r" "$first" 64KiB \
    "perftest ib_write_bw stream_64KiB -s 65536 -D $PERF_SECS" \
    "rstream_run stream_64KiB -S 65536 -C 1000 -I 1" \
    "rsockperf_run stream_64KiB stream 64KiB"
  perf_group "$r" "$first" 4KiB \
    "perftest ib_write_bw stream_4KiB -s 4096 -D $PERF_SECS" \
    "rstream_run stream_4KiB -S 4096 -C 10000 -I 1" \
    "rsockperf_run stream_4KiB stream 4KiB"
  perf_group "$r" "$first" 64B \
    "perftest ib_write_lat rtt_64B -s 64 -n 5000" \
    "rstream_run rtt_64B -S 64 -C 1 -I 5000" \
    "rsockperf_run rtt_64B_spin pingpong 64 -spin 100000"
  # rsock's default mode next to the C pair that also sleeps on its completion channel.
  if [ "$first" = perftest ]; then
    cmd_step perf_rc_pingpong_64B_event$r rcpingpong_run rtt_64B_event -s 64 -n 2000
    cmd_step perf_rsockperf_rtt_64B$r rsockperf_run rtt_64B pingpong 64
  else
    cmd_step perf_rsockperf_rtt_64B$r rsockperf_run rtt_64B pingpong 64
    cmd_step perf_rc_pingpong_64B_event$r rcpingpong_run rtt_64B_event -s 64 -n 2000
  fi
}

# perf_group <round suffix> <first reference> <size> <perftest cmd> <rstream cmd>
# <rsockperf_run cmd>: the three as steps (named by tool and size, rsock's by its
# measure), the first reference, rsock, then the other.
perf_group() {
  local r=$1 first=$2 size=$3 pt=$4 rs=$5 rp=$6 ptname rpname
  ptname=perf_${pt#perftest }; ptname=${ptname%% *}_$size$r
  rpname=perf_rsockperf_${rp#rsockperf_run }; rpname=${rpname%% *}$r
  if [ "$first" = perftest ]; then
    cmd_step "$ptname" $pt
    cmd_step "$rpname" $rp
    cmd_step "perf_rstream_$size$r" $rs
  else
    cmd_step "perf_rstream_$size$r" $rs
    cmd_step "$rpname" $rp
    cmd_step "$ptname" $pt
  fi
}

# perf_ratios: rsock's figures over perftest's and rstream's, the median over the rounds
# of each round's ratio, with the rounds' ratios in brackets; the figures shown are the
# medians of the rounds'. Throughput: >1 is rsock faster; round trip: >1 is rsock
# slower. A round missing a figure (perftest's "-": its clock calibration failed) does
# not count for that ratio; a measure with no round at all fails the step.
perf_ratios() {
  awk '
    function num(x) { return x != "" && x != "-" && x + 0 > 0 }
    # med: the median of a[1..n], sorted in place; "-" when n is 0.
    function med(a, n,   i, j, t) {
      if (n == 0) return "-"
      for (i = 2; i <= n; i++) { t = a[i]; for (j = i - 1; j >= 1 && a[j] > t; j--) a[j + 1] = a[j]; a[j + 1] = t }
      return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    function fmt(x, f) { return x == "-" ? x : sprintf(f, x) }
    # figure: the median of tool t measure m over the rounds.
    function figure(t, m,   r, k, a) {
      k = 0
      for (r = 1; r <= rounds; r++) if (num(v[t, m, r])) a[++k] = v[t, m, r]
      return med(a, k)
    }
    # ratio: the median over the rounds of rsock m over tool t measure ref; list gets
    # the rounds ratios.
    function ratio(m, t, ref,   r, k, a, x) {
      k = 0; list = ""
      for (r = 1; r <= rounds; r++) {
        if (!num(v["rsock", m, r]) || !num(v[t, ref, r])) continue
        x = v["rsock", m, r] / v[t, ref, r]
        a[++k] = x; list = list (list == "" ? "" : " ") sprintf("%.2f", x)
      }
      if (k == 0) missing = missing " " t "/" ref
      return fmt(med(a, k), "%.2f")
    }
    NF >= 4 { v[$1, $2, $4] = $3; if ($4 + 0 > rounds) rounds = $4 + 0 }
    END {
      n = split("stream_64KiB stream_4KiB rtt_64B rtt_64B_spin", m, " ")
      for (i = 1; i <= n; i++) {
        ref = m[i]; sub(/_spin$/, "", ref) # the references always busy-poll
        unit = (m[i] ~ /^rtt/) ? "us round trip" : "MB/s"
        missing = ""
        rp = ratio(m[i], "perftest", ref); lp = list
        rs = ratio(m[i], "rstream", ref); ls = list
        if (missing != "") { printf "missing figures for %s:%s\n", m[i], missing; bad = 1 }
        printf "@@RATIO %-12s rsock %s, perftest %s, rstream %s (%s, medians of %d rounds); rsock/perftest %s [%s], rsock/rstream %s [%s]\n", \
          m[i] ":", fmt(figure("rsock", m[i]), "%.2f"), fmt(figure("perftest", ref), "%.2f"), fmt(figure("rstream", ref), "%.2f"), unit, rounds, rp, lp, rs, ls
      }
      # rsock in default mode next to a C pair that also sleeps on its completion channel.
      missing = ""
      rc = ratio("rtt_64B", "rcpingpong", "rtt_64B_event"); lc = list
      if (missing != "") { printf "missing figures for rtt_64B_event:%s\n", missing; bad = 1 }
      printf "@@RATIO %-12s rsock %s, ibv_rc_pingpong -e %s (us round trip, both sleeping on completions, medians of %d rounds); rsock/rc_pingpong %s [%s]\n", \
        "rtt_64B_event:", fmt(figure("rsock", "rtt_64B"), "%.2f"), fmt(figure("rcpingpong", "rtt_64B_event"), "%.2f"), rounds, rc, lc
      exit bad
    }' /tmp/perf.txt
}
