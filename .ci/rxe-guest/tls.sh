# tls.sh: rsock bootstrapped over QUIC between the two hosts (busybox sh, sourced by
# /init). Both QUIC sockets are bound to the wildcard address (the client's always is;
# the server listens on ":port"), so each side finds its device (rxe_a on host A, rxe_b
# on host B) only by the source address of its route to the other; the RDMA stream
# then runs TLS 1.3 (rdma+tls). rsockperf's client fails when a connection reports another
# transport than the one named, so a run that completes proves the upgrade. It measures
# encrypted RDMA next to plaintext RDMA and QUIC, one second per figure.

tls_two_hosts() {
  local spid crc src list=RsockRDMA,RsockRDMATLS,RsockQUIC
  timeout -k 5 150 /t/bin/rsockperf -mode server -addr :7200 -transports $list > /tmp/tls_s.log 2>&1 &
  spid=$!
  wait_listen 7202 $spid || { kill $spid 2>/dev/null; cat /tmp/tls_s.log; return 1; }
  timeout -k 5 120 /t/bin/rsockperf -mode client -q -addr $B:7200 -transports $list \
    -workloads stream,pingpong -sizes 64,64KiB -duration 1s > /tmp/tls_c.log 2>&1
  crc=$?
  stop $spid rsockperf-server
  src=$?
  cat /tmp/tls_c.log
  [ $crc = 0 ] && [ $src = 0 ] || { echo "--- server:"; cat /tmp/tls_s.log; echo "client $crc, server $src"; return 1; }
  awk '
    /^stream:/ { w = "stream" } /^pingpong:/ { w = "pingpong" }
    # A table row names its size only on the first of its transports.
    $1 ~ /^[0-9]+(B|KiB|MiB)$/ && $2 ~ /^Rsock/ { size = $1; t = $2; v = $3 }
    $1 ~ /^Rsock/ { t = $1; v = $2 }
    $1 ~ /^Rsock/ || $2 ~ /^Rsock/ {
      if (w == "stream" && size == "64KiB") { print "figure: stream 64KiB", t, v, "MB/s"; n++ }
      if (w == "pingpong" && size == "64B") { print "figure: rtt 64B", t, v; n++ }
    }
    END { exit n != 6 }' /tmp/tls_c.log || { echo "missing figures (want 3 transports x 2)"; return 1; }
}
