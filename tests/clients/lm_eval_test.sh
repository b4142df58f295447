#!/usr/bin/env bash
# lm-evaluation-harness against a real cluster, as users score a model through an
# OpenAI-compatible server: `lm_eval --model local-completions` on a `tandem up` of the tiny
# Qwen3 fixture (tests/fixtures/hf/qwen3_f32), over two tasks defined in local files: a
# loglikelihood task (multiple_choice: echo + logprobs) and a generate_until task, once with
# lm_eval's remote tokenizer (tokenizer_backend=remote: the server's /tokenizer_info, /tokenize
# and /detokenize) and, where transformers is installed, once with the fixture's tokenizer.json
# as its huggingface tokenizer. lm_eval_check.py then holds each run's logged answers to the
# server's own: every loglikelihood to the prompt log-probabilities of the same tokens
# (max_tokens 0), every generation to a greedy completion with the same stop.
# lm_eval is not installed by scripts/setup.sh. The test uses $TANDEM_LM_EVAL_PYTHON (default
# python3) and is skipped (exit 77), saying so, when that Python cannot import lm_eval. To run
# it:
#   python3 -m venv ENV && ENV/bin/pip install "lm_eval[api]" && \
#     TANDEM_LM_EVAL_PYTHON=ENV/bin/python ctest -R lm_eval_test
#   lm_eval_test.sh BIN_DIR SOURCE_DIR
set -euo pipefail
BIN=$(realpath "$1") SRC=$(realpath "$2")
PY=${TANDEM_LM_EVAL_PYTHON:-python3}
if ! "$PY" -c 'import lm_eval, tenacity' 2>/dev/null; then
  echo "SKIP: $PY cannot import lm_eval (set TANDEM_LM_EVAL_PYTHON to a Python with lm_eval[api])"
  exit 77
fi
source "$SRC/tests/clients/tandem_up.sh"

MODEL="$SRC/tests/fixtures/hf/qwen3_f32"
start_tandem_up --model "$MODEL"

# The tasks: local JSON lines and their YAML definitions.
cat >"$WORK/ll.jsonl" <<'DATA'
{"question": "The capital of France is", "choices": ["Paris", "London", "a cat"], "answer": 0}
{"question": "One, two,", "choices": ["three", "seven"], "answer": 0}
{"question": "Red, green and", "choices": ["blue", "dog", "the end of it"], "answer": 0}
DATA
cat >"$WORK/gen.jsonl" <<'DATA'
{"question": "Q: Say hello.\nA:", "answer": " hello"}
{"question": "Q: What is 2 + 2?\nA:", "answer": " 4"}
DATA
cat >"$WORK/tandem_ll.yaml" <<YAML
task: tandem_ll
dataset_path: json
dataset_kwargs:
  data_files:
    test: $WORK/ll.jsonl
test_split: test
output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
YAML
cat >"$WORK/tandem_gen.yaml" <<YAML
task: tandem_gen
dataset_path: json
dataset_kwargs:
  data_files:
    test: $WORK/gen.jsonl
test_split: test
output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{answer}}"
generation_kwargs:
  until: ["\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0
metric_list:
  - metric: exact_match
YAML

NAME=$(basename "$MODEL")
# One lm_eval run with tokenizer backend $1 (and its model_args), checked against the server.
run_lm_eval() {
  local backend=$1 args=$2 out="$WORK/out-$1"
  HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 "$PY" -m lm_eval --model local-completions \
    --model_args "model=$NAME,base_url=http://$HTTP/v1/completions,$args,num_concurrent=2,max_retries=1,tokenized_requests=True" \
    --tasks tandem_ll,tandem_gen --include_path "$WORK" --output_path "$out" --log_samples \
    >"$WORK/lm_eval-$backend.log" 2>&1 ||
    { echo "lm_eval ($backend tokenizer) failed:"; tail -30 "$WORK/lm_eval-$backend.log"; exit 1; }
  grep -E '^\|' "$WORK/lm_eval-$backend.log" || true
  echo "--- $backend tokenizer"
  "$PY" "$SRC/tests/clients/lm_eval_check.py" "$out" "$HTTP" "${3:-$MODEL}" "$NAME"
}
run_lm_eval remote "tokenizer_backend=remote" remote
if "$PY" -c 'import transformers' 2>/dev/null; then
  run_lm_eval huggingface "tokenizer_backend=huggingface,tokenizer=$MODEL"
else
  echo "(transformers not installed: the huggingface tokenizer run is left out)"
fi
