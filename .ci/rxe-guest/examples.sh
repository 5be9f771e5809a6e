# examples.sh: the examples as two processes, server on host B, client on host A
# (busybox sh, sourced by /init). Each pair is one step; it passes when the client
# succeeds, both ends say they are on rdma, and the server saw the client come from A.

# run_pair <server cmd> <port> <client cmd...>: runs the server on B in the background,
# then the client; prints both outputs; leaves them in /tmp/ex_server.log and
# /tmp/ex_client.log. It passes when both exit cleanly, whatever their transport.
run_pair() {
  local server=$1 port=$2 spid crc src
  shift 2
  timeout -k 5 180 /t/bin/"$server" -addr $B:"$port" > /tmp/ex_server.log 2>&1 &
  spid=$!
  wait_listen "$port" $spid || { kill $spid 2>/dev/null; cat /tmp/ex_server.log; return 1; }
  timeout -k 5 120 "$@" > /tmp/ex_client.log 2>&1
  crc=$?
  stop $spid "$server"
  src=$?
  echo "--- client (host A): $*"
  cat /tmp/ex_client.log
  echo "--- server (host B): $server -addr $B:$port"
  cat /tmp/ex_server.log
  [ $crc = 0 ] || { echo "client exited with status $crc"; return 1; }
  [ $src = 0 ]
}

# pair <server cmd> <port> <client cmd...>: run_pair, and no connection fell back.
pair() {
  run_pair "$@" || return 1
  if grep -q 'not rdma' /tmp/ex_client.log /tmp/ex_server.log; then
    echo "a connection fell back from rdma"
    return 1
  fi
}

# expect <file> <pattern> <what>: fails, saying what is missing, unless grep finds it.
expect() {
  grep -Eq -- "$2" "$1" || { echo "missing in $1: $3 (/$2/)"; return 1; }
}

example_echo() {
  pair echo_server 7000 /t/bin/echo_client -addr $B:7000 -msg "hello over rxe" || return 1
  expect /tmp/ex_client.log "over rdma\$" "the client on rdma" &&
    expect /tmp/ex_client.log '^echo: hello over rxe$' "the echo" &&
    expect /tmp/ex_server.log "$A:[0-9]+ connected over rdma\$" "the server on rdma, with the client on host A"
}

example_http() {
  pair http_server 8080 /t/bin/http_client -url http://$B:8080 -n 3 -upload 16 || return 1
  expect /tmp/ex_client.log "new connection to $B:8080 over rdma\$" "the client on rdma" &&
    expect /tmp/ex_client.log 'SHA-256 matches' "the upload's digest" &&
    expect /tmp/ex_server.log "$A:[0-9]+ GET / over rdma\$" "the server on rdma, with the client on host A"
}

example_grpc() {
  pair grpc_server 9090 /t/bin/grpc_client -addr $B:9090 -calls 1000 || return 1
  expect /tmp/ex_client.log "connected to $B:9090 over rdma\$" "the client on rdma" &&
    expect /tmp/ex_client.log 'Echo calls in' "the timed calls" &&
    expect /tmp/ex_server.log "$A:[0-9]+ connected over rdma" "the server on rdma, with the client on host A"
}
