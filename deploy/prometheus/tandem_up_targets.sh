#!/usr/bin/env bash
# Reads `tandem up`'s stdout and writes the Prometheus file_sd targets of every process it
# started to $1 (rewritten atomically as lines arrive). Every line is passed through to stdout.
#   tandem up --model M | deploy/prometheus/tandem_up_targets.sh deploy/prometheus/targets/tandem.json
set -euo pipefail
out=${1:?usage: tandem_up_targets.sh TARGETS.json}
entries=()
while IFS= read -r line; do
  printf '%s\n' "$line"
  # "metrics ROLE=HOST:PORT"
  if [[ $line =~ ^metrics\ ([a-z]+)=([^ ]+)$ ]]; then
    entries+=("{\"targets\": [\"${BASH_REMATCH[2]}\"], \"labels\": {\"tandem_process\": \"${BASH_REMATCH[1]}\"}}")
    json="["
    for i in "${!entries[@]}"; do
      [[ $i -gt 0 ]] && json+=", "
      json+="${entries[$i]}"
    done
    json+="]"
    printf '%s\n' "$json" >"$out.tmp"
    mv "$out.tmp" "$out"
  fi
done
