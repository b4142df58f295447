#!/usr/bin/env bash
# The container check: builds the CPU image from deploy/docker/Dockerfile as docs/deploy.md
# tells users to, and runs it the way the Kubernetes manifests do. No Docker daemon or registry
# is needed: podman builds with chroot isolation, and the cluster runs the image's exported root
# filesystem by chroot inside a network and mount namespace of its own.
#   1. Base images: debian:12 and debian:12-slim, when podman does not have them, come from
#      `debootstrap --variant=minbase bookworm` (the Debian mirror apt uses), imported by podman.
#   2. `podman build --isolation=chroot --pull=never --format docker` of the CPU variant.
#   3. scripts/container_check.py: the image's contents (its binaries and nothing of the tests,
#      benchmarks or fault injection), then a 1 router + 1 prefill + 1 decode cluster started
#      from the image with the command, arguments, environment, volumes and user of
#      `kubectl kustomize deploy/k8s/overlays/cpu-demo` (only addresses rewritten to loopback),
#      a request over gRPC and one over the OpenAI HTTP API, a graceful stop; then the same for
#      the cpu-smollm2 overlay (the default chat model mounted from its claim, backed by
#      scripts/fetch_model.sh --smollm2's cache folder) with a question through the chat API;
#      and the image's default command with its HEALTHCHECK.
# Runs as root (re-runs itself through sudo otherwise). CI runs it from scripts/test.sh.
#   CONTAINER_CHECK_DIR  scratch folder (default: a new one under /tmp, removed at the end)
#   TANDEM_IMAGE         the image's tag (default localhost/tandem:cpu)
#   DEMO_MODEL           the build argument (default 0: the model is mounted from
#                        scripts/fetch_model.sh's folder, as a Kubernetes volume would be)
#   CONTAINER_BUILD_NICE the image build's nice level (default 0; scripts/test.sh: 19)
#   VARIANT=cuda         the CUDA image instead (docs/deploy.md's CUDA command; its nvidia/cuda
#                        base images are pulled, so it needs a machine that can pull them)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -ne 0 ]; then exec sudo -E bash "$0" "$@"; fi
variant="${VARIANT:-cpu}"
image="${TANDEM_IMAGE:-localhost/tandem:$variant}"
case "$variant" in
  cpu)  build_args=(--pull=never --build-arg BUILD_IMAGE=debian:12
          --build-arg RUNTIME_IMAGE=debian:12-slim --build-arg TANDEM_CUDA=OFF) ;;
  cuda) build_args=() ;;
  *) echo "container_check: VARIANT is cpu or cuda" >&2; exit 2 ;;
esac
work="${CONTAINER_CHECK_DIR:-$(mktemp -d /tmp/tandem-container.XXXXXX)}"
mkdir -p "$work"
cleanup() {
  [ -n "${CONTAINER_CHECK_DIR:-}" ] || rm -rf "$work"
}
trap cleanup EXIT
step() { echo "container_check: $*" >&2; }
started=$SECONDS

for tool in podman debootstrap kubectl unshare; do
  command -v "$tool" >/dev/null || { echo "container_check: $tool is missing (scripts/setup.sh)" >&2; exit 1; }
done

# 1. Base images.
if [ "$variant" = cpu ] && { ! podman image exists docker.io/library/debian:12 ||
   ! podman image exists docker.io/library/debian:12-slim; }; then
  mirror="$(sed -n 's/^URIs: *\(http[^ ]*\/debian\)$/\1/p' /etc/apt/sources.list.d/debian.sources \
    2>/dev/null | head -1)"
  mirror="${mirror:-http://deb.debian.org/debian}"
  step "debootstrap bookworm from $mirror"
  debootstrap --variant=minbase bookworm "$work/base" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -20 "$work/debootstrap.log" >&2; exit 1; }
  tar -C "$work/base" -c . | podman import - docker.io/library/debian:12 >/dev/null 2>&1
  podman tag docker.io/library/debian:12 docker.io/library/debian:12-slim
  rm -rf "$work/base"
fi

# 2. The image, with the build arguments of docs/deploy.md's command for the variant.
step "podman build $image ($((SECONDS - started)) s)"
if ! nice -n "${CONTAINER_BUILD_NICE:-0}" podman build --isolation=chroot --format docker \
    -f deploy/docker/Dockerfile -t "$image" "${build_args[@]}" \
    --build-arg DEMO_MODEL="${DEMO_MODEL:-0}" . >"$work/build.log" 2>&1; then
  tail -40 "$work/build.log" >&2
  echo "container_check: FAIL: the image does not build (log above)" >&2
  exit 1
fi

# 3. Its root filesystem and configuration, then the checks.
step "exporting the image ($((SECONDS - started)) s)"
cid="$(podman create "$image")"
mkdir -p "$work/rootfs"
podman export "$cid" | tar -x -C "$work/rootfs"
podman rm "$cid" >/dev/null 2>&1
podman image inspect "$image" >"$work/image.json"
for overlay in cpu-demo cpu-smollm2; do
  kubectl kustomize "deploy/k8s/overlays/$overlay" >"$work/$overlay.yaml" 2>"$work/kustomize.log" ||
    { cat "$work/kustomize.log" >&2; exit 1; }
done
models="$(bash scripts/fetch_model.sh --shared-dir)/models"
# The chat model's overlay mounts the GGUF from the claim tandem-models: its cache folder.
clusters=(--manifests "$work/cpu-demo.yaml")
if smollm2="$(bash scripts/fetch_model.sh --smollm2)"; then
  clusters+=(--chat-manifests "$work/cpu-smollm2.yaml" --claim "tandem-models=$(dirname "$smollm2")")
else
  step "SmolLM2 could not be fetched: the cpu-smollm2 overlay is not run"
fi

step "running the image as the manifests do ($((SECONDS - started)) s)"
unshare --net --mount --fork /usr/bin/python3 scripts/container_check.py \
  --rootfs "$work/rootfs" --image-config "$work/image.json" \
  "${clusters[@]}" --models "$models" --work "$work"
step "ok ($((SECONDS - started)) s)"
