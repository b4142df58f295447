# Sourced by the router benchmarks (concurrency.sh, fairness.sh): builds `tandem` and
# `tandem-server` plus the targets in $EXTRA_TARGETS, raises the open-files limit to the hard
# one, and starts a default `tandem up` (stories260K, one prefill and one decode worker) that
# the caller's exit stops. Sets: up (its pid), out (a temporary folder), url (http://HOST:PORT
# of the OpenAI API), grpc_target (the public gRPC API), metrics (http://HOST:PORT of the
# router's /metrics), router_pid. Needs BUILD_DIR; `bench_name` names the caller in errors.
shared="$(bash scripts/fetch_model.sh)"
bin="$BUILD_DIR/bin"
out="$(mktemp -d)"
# shellcheck disable=SC2086  # EXTRA_TARGETS is a list of target names
cmake --build "$BUILD_DIR" --target tandem tandem-server ${EXTRA_TARGETS:-} >/dev/null
ulimit -n "$(ulimit -Hn)"

"$bin/tandem" up --model "$shared/models/stories260K/stories260K.bin" \
  --tokenizer "$shared/models/stories260K/tok512.bin" --prefill 1 --decode 1 \
  >"$out/up.out" 2>"$out/up.log" &
up=$!
trap 'kill -INT $up 2>/dev/null || true; wait $up 2>/dev/null || true; rm -rf "$out"' EXIT
url=""
for _ in $(seq 1 1200); do
  url="$(sed -n 's/^http router=\(.*\)$/http:\/\/\1/p' "$out/up.out" | head -1)"
  [ -n "$url" ] && break
  sleep 0.1
done
[ -n "$url" ] || { echo "$bench_name: tandem up did not start" >&2; cat "$out/up.log" >&2; exit 1; }
grpc_target="$(sed -n 's/^ready router=\(.*\)$/\1/p' "$out/up.out" | head -1)"
metrics="$(sed -n 's/^metrics router=\(.*\)$/http:\/\/\1/p' "$out/up.out" | head -1)"
router_pid=$(pgrep -P "$up" -f -- "--role=router" | head -1)
sleep 1  # idle figures after startup
