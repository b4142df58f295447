# Sourced by the client tests (python_clients_test.sh, lm_eval_test.sh), after they set BIN (the
# build's bin folder): a scratch folder $WORK, and start_tandem_up ARGS..., which starts
# `tandem up ARGS...` in the background, waits until its router answers and sets GRPC and HTTP
# to the router's addresses, and stop_tandem_up. On exit the cluster is stopped and $WORK
# removed.
WORK=$(mktemp -d)
UP_PID=""
cleanup() {
  if [ -n "$UP_PID" ]; then kill -TERM "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

stop_tandem_up() {
  if [ -n "$UP_PID" ]; then kill -TERM "$UP_PID" 2>/dev/null || true; wait "$UP_PID" 2>/dev/null || true; fi
  UP_PID=""
}

start_tandem_up() {
  "$BIN/tandem" up "$@" >"$WORK/up.out" 2>"$WORK/up.err" &
  UP_PID=$!
  for _ in $(seq 1 300); do
    if grep -q '^http router=' "$WORK/up.out" && grep -q '^ready router=' "$WORK/up.out"; then break; fi
    if ! kill -0 "$UP_PID" 2>/dev/null; then echo "tandem up exited:"; cat "$WORK/up.err"; exit 1; fi
    sleep 0.1
  done
  GRPC=$(sed -n 's/^ready router=//p' "$WORK/up.out")
  HTTP=$(sed -n 's/^http router=//p' "$WORK/up.out")
  [ -n "$GRPC" ] && [ -n "$HTTP" ] || { echo "no router address:"; cat "$WORK/up.out" "$WORK/up.err"; exit 1; }
}
