#!/usr/bin/env bash
# A three-node replicated logheap-kv cluster (`logheap kv-server`) on the loopback
# interface, on one machine.
#
#   scripts/kv-cluster.sh start        start nodes 1-3 (the first start makes the cluster)
#   scripts/kv-cluster.sh stop         stop every node (SIGTERM)
#   scripts/kv-cluster.sh kill N       kill node N with SIGKILL
#   scripts/kv-cluster.sh restart N    start node N again on its pool
#   scripts/kv-cluster.sh status       each node's pid and what it says of the leader
#
# Node N listens on 127.0.0.1:2100N and keeps its pool, log and pid in $KV_CLUSTER_DIR
# (default /dev/shm/logheap-kv-cluster, else a directory under /tmp). The binary is
# $LOGHEAP (default target/release/logheap; `cargo build --release` makes it).
# Example once started:
#   curl -X PUT --data-binary hello http://127.0.0.1:21001/kv/greeting
#   curl http://127.0.0.1:21002/kv/greeting      # a follower names the leader (421)
set -euo pipefail
cd "$(dirname "$0")/.."

LOGHEAP=${LOGHEAP:-target/release/logheap}
if [ -z "${KV_CLUSTER_DIR:-}" ]; then
  if [ -d /dev/shm ]; then KV_CLUSTER_DIR=/dev/shm/logheap-kv-cluster; else KV_CLUSTER_DIR=/tmp/logheap-kv-cluster; fi
fi
NODES="1 2 3"

addr() { echo "127.0.0.1:2100$1"; }

start_node() {
  local n=$1
  local pidfile="$KV_CLUSTER_DIR/n$n.pid"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "node $n is running (pid $(cat "$pidfile"))"
    return
  fi
  local init=()
  # The first start of node 1 makes the cluster of all three.
  if [ "$n" = 1 ] && [ ! -e "$KV_CLUSTER_DIR/n1.pool" ]; then
    for m in $NODES; do init+=(--init "$m=$(addr "$m")"); done
  fi
  "$LOGHEAP" kv-server --id "$n" --addr "$(addr "$n")" --pool "$KV_CLUSTER_DIR/n$n.pool" \
    ${init[@]+"${init[@]}"} >>"$KV_CLUSTER_DIR/n$n.log" 2>&1 &
  echo $! >"$pidfile"
  echo "node $n started (pid $!, $(addr "$n"))"
}

signal_node() {
  local n=$1 sig=$2
  local pidfile="$KV_CLUSTER_DIR/n$n.pid"
  if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    kill "-$sig" "$(cat "$pidfile")"
    wait "$(cat "$pidfile")" 2>/dev/null || true
    echo "node $n: $sig"
  else
    echo "node $n is not running"
  fi
  rm -f "$pidfile"
}

[ -x "$LOGHEAP" ] || { echo "$LOGHEAP is missing: cargo build --release" >&2; exit 1; }
mkdir -p "$KV_CLUSTER_DIR"
case "${1:-}" in
  start) for n in $NODES; do start_node "$n"; done ;;
  stop) for n in $NODES; do signal_node "$n" TERM; done ;;
  kill) signal_node "${2:?node number}" KILL ;;
  restart) start_node "${2:?node number}" ;;
  status)
    for n in $NODES; do
      pidfile="$KV_CLUSTER_DIR/n$n.pid"
      if [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        leader=$(curl -s --max-time 1 "http://$(addr "$n")/cluster/metrics" \
          | grep -o '"current_leader":[0-9a-z]*' || true)
        echo "node $n: pid $(cat "$pidfile"), $leader"
      else
        echo "node $n: down"
      fi
    done ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
