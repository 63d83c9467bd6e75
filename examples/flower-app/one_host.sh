#!/usr/bin/env bash
# A whole Flower deployment on this one host: one SuperLink and one SuperNode per exported site, each on
# its own ports, stopped together on exit or Ctrl-C (docs/flower.md, "A deployment on one host").
#
#   one_host.sh SITES [--tls CERTS] [--port PORT] [--work DIR] [--warm] [--dry-run]
#
#   SITES   what `fedhet partition CONFIG --export-sites SITES` wrote (its nodes.txt: one node config a line)
#   --tls CERTS  a folder with ca.crt, server.pem and server.key (the openssl lines in docs/flower.md);
#                without it everything runs --insecure (loopback only)
#   --port PORT  the SuperLink's port (default 9092); SuperNode k serves its ClientApp API on PORT+10+k
#   --work DIR   logs, pids and the flwr CLI's configuration (FLWR_HOME) (default ./one-host)
#   --warm       warm nodes: each SuperNode runs with --isolation process and fedhet's warm SuperExec
#                (python -m fedhet.flower.node_exec) beside it, so that no message waits for torch and
#                fedhet to be imported again; it is stopped with the rest (also: FEDHET_WARM_NODES=1)
#   --dry-run    print the commands it would start, one a line, and exit
#
# When every node has joined it prints "ready" and the `flwr run` line to submit a run, then waits.
set -euo pipefail

usage() { sed -n '4,16p' "$0" >&2; exit 2; }
[ $# -ge 1 ] || usage
sites=$(cd "$1" && pwd); shift
certs="" port=9092 work="one-host" warm="${FEDHET_WARM_NODES:-0}" dry=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tls) certs=$(cd "$2" && pwd); shift 2 ;;
    --port) port="$2"; shift 2 ;;
    --work) work="$2"; shift 2 ;;
    --warm) warm=1; shift ;;
    --dry-run) dry=1; shift ;;
    *) usage ;;
  esac
done
case "$warm" in 0|1) ;; *) echo "FEDHET_WARM_NODES=$warm: set it to 1 (warm nodes) or 0" >&2; exit 2 ;; esac
[ -f "$sites/nodes.txt" ] || { echo "$sites/nodes.txt not found: run fedhet partition CONFIG --export-sites $sites" >&2; exit 2; }
# the warm SuperExec runs in the Python environment that holds flower-supernode (and fedhet)
python="$(dirname "$(command -v flower-supernode || echo ./flower-supernode)")/python"
[ -x "$python" ] || python=python
if [ "$dry" = 0 ]; then
  mkdir -p "$work/flwr-home"
  work=$(cd "$work" && pwd)
  : > "$work/pids"
fi

pids=()
stop() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done   # each its own group
  for _ in $(seq 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.2
  done
  for pid in "${pids[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 130' INT TERM

start() {  # start NAME CMD...: in its own process group, output to WORK/NAME.log
  local name=$1; shift
  if [ "$dry" = 1 ]; then printf "%q " "$@"; echo; pids+=("${name^^}_PID"); return; fi
  setsid "$@" > "$work/$name.log" 2>&1 &
  pids+=($!)
  echo "$name $!" >> "$work/pids"
}

wait_for() {  # wait_for NAME TEXT SECONDS
  [ "$dry" = 0 ] || return 0
  local deadline=$((SECONDS + $3))
  until grep -q "$2" "$work/$1.log" 2>/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      echo "$1 did not print '$2' within $3 s; its log:" >&2; tail -20 "$work/$1.log" >&2; exit 1
    fi
    sleep 0.3
  done
}

if [ -n "$certs" ]; then
  link=(--ssl-certfile "$certs/server.pem" --ssl-keyfile "$certs/server.key" --ssl-ca-certfile "$certs/ca.crt")
  node=(--root-certificates "$certs/ca.crt")
  connection="root-certificates = \"$certs/ca.crt\""
else
  link=(--insecure) node=(--insecure) connection="insecure = true"
fi

start superlink flower-superlink "${link[@]}" --disable-runtime-dependency-installation --port "$port"
wait_for superlink "Uvicorn running on" 60

isolation=()
[ "$warm" = 1 ] && isolation=(--isolation process)  # the node starts no SuperExec: fedhet's runs beside it
k=0
while IFS= read -r config; do
  [ -n "$config" ] || continue
  start "node$k" flower-supernode --superlink "127.0.0.1:$port" "${node[@]}" ${isolation[@]+"${isolation[@]}"} \
    --port $((port + 10 + k)) --node-config "$config"
  if [ "$warm" = 1 ]; then  # --insecure: the node's own runtime API on 127.0.0.1 is plain HTTP
    start "node$k-exec" "$python" -m fedhet.flower.node_exec --insecure \
      --runtime-api-address "127.0.0.1:$((port + 10 + k))" --parent-pid "${pids[-1]}"
  fi
  k=$((k + 1))
done < "$sites/nodes.txt"
[ "$dry" = 0 ] || { trap - EXIT; exit 0; }
for i in $(seq 0 $((k - 1))); do wait_for "node$i" "SuperNode ID" 60; done

cat > "$work/flwr-home/config.toml" <<EOF
[superlink]
default = "local"

[superlink.local]
address = "127.0.0.1:$port"
$connection
EOF

echo "ready: a SuperLink on 127.0.0.1:$port and $k SuperNodes$([ "$warm" = 1 ] && echo ", warm") (logs and pids in $work)"
echo "submit a run:  FLWR_HOME=$work/flwr-home flwr run APP_DIR local --stream --run-config \"...\""
while :; do sleep 1; done
