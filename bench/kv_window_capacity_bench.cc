// How many long sequences a decode worker holds at once when a model's sliding-window layers
// keep only their window (engine/kv/block_table.h), against a cache that keeps every layer's
// KV (one group): the decode engine's own sizing (KvCacheSpec::BlocksIn of --kv-bytes) and its
// own scheduler (DecodeScheduler: admission, growth, letting blocks go, preemption), driven with
// requests of --context tokens (--max-tokens of them generated) admitted whenever they fit until
// --requests have finished, with blocks on demand and with max_tokens reserved at admission. Prints
// a table and writes JSON to --out (bench/results/kv_window_capacity.json).
//
//   kv_window_capacity_bench --model PATH [--kv-bytes N] [--context N] [--max-tokens N]
//                            [--block-size N] [--kv-dtype f32|bf16|f16|fp8] [--requests N]
//
// --model: a GGUF file or an HF directory (only its configuration is read), e.g. Gemma 3 270M
// (scripts/fetch_model.sh --gemma3). Defaults: 4 GiB, 8192 tokens, 512 generated, blocks of 16,
// f32 (the CPU engine's), 200 requests.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/scheduling/scheduler.h"
#include "formats/mapped_file.h"

namespace {

using tandem::DecodeScheduler;
using tandem::KvCacheSpec;

struct Result {
  const char* mode;
  const char* admission;
  KvCacheSpec spec;
  int blocks = 0;
  int64_t blocks_per_sequence = 0;  // at --context tokens
  int64_t sequences_fit = 0;        // blocks / blocks_per_sequence
  int peak_running = 0;
  double mean_running = 0;  // over decode steps
  int64_t preemptions = 0;
  int64_t steps = 0;
};

// Runs `requests` requests of `prompt` + `max_tokens` tokens through a decode scheduler over
// `spec`'s cache of `budget` bytes, admitting whenever admission allows.
Result Run(const char* mode, DecodeScheduler::Admission admission, const KvCacheSpec& spec,
           int64_t budget, int prompt, int context, int requests) {
  const bool reserve = admission == DecodeScheduler::Admission::kReserve;
  Result r{mode, reserve ? "reserve" : "on-demand", spec};
  r.blocks = spec.BlocksIn(budget);
  r.blocks_per_sequence = spec.table_layout().BlocksAt(context);
  r.sequences_fit = r.blocks / std::max<int64_t>(1, r.blocks_per_sequence);
  DecodeScheduler::Options o;
  o.num_blocks = r.blocks;
  o.block_size = spec.block_size;
  o.max_running = 4096;
  o.group_window = spec.group_window;
  o.admission = admission;
  DecodeScheduler s(o);
  uint64_t next = 1;
  int done = 0;
  double running_sum = 0;
  while (done < requests) {
    while (next <= static_cast<uint64_t>(requests) && s.Admit(next, prompt, context).ok()) {
      s.Start(next).IgnoreError();
      ++next;
    }
    DecodeScheduler::Step step = s.Schedule();
    if (step.work.empty() && s.num_admitted() == 0) {
      std::fprintf(stderr, "%s: a %d-token sequence does not fit in %d blocks\n", mode, context,
                   r.blocks);
      break;
    }
    s.Complete(step);
    ++r.steps;
    r.peak_running = std::max(r.peak_running, static_cast<int>(s.running().size()));
    running_sum += static_cast<double>(s.running().size());
    for (const auto& w : step.work) {
      if (w.sample && s.tokens(w.id) >= context) {
        s.Release(w.id);
        ++done;
      }
    }
  }
  r.mean_running = r.steps > 0 ? running_sum / r.steps : 0;
  r.preemptions = s.preemptions();
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, out = "bench/results/kv_window_capacity.json", dtype_name = "f32";
  int64_t budget = int64_t{4} << 30;
  int context = 8192, max_tokens = 512, block_size = 16, requests = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--model") {
      model = value;
    } else if (flag == "--kv-bytes") {
      budget = std::atoll(value.c_str());
    } else if (flag == "--context") {
      context = std::atoi(value.c_str());
    } else if (flag == "--max-tokens") {
      max_tokens = std::atoi(value.c_str());
    } else if (flag == "--block-size") {
      block_size = std::atoi(value.c_str());
    } else if (flag == "--kv-dtype") {
      dtype_name = value;
    } else if (flag == "--requests") {
      requests = std::atoi(value.c_str());
    } else if (flag == "--out") {
      out = value;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", flag.c_str());
      return 2;
    }
  }
  if (model.empty() || budget <= 0 || max_tokens < 1 || context <= max_tokens || block_size < 1 ||
      requests < 1) {
    std::fprintf(stderr,
                 "need --model PATH; --kv-bytes, --block-size, --requests > 0; "
                 "0 < --max-tokens < --context\n");
    return 2;
  }
  auto config = tandem::LoadModelConfig(model);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  auto dtype = tandem::ParseKvDtype(dtype_name);
  if (!dtype.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dtype.status().message()).c_str());
    return 2;
  }
  if (context > config->max_seq_len) {
    std::fprintf(stderr, "--context %d exceeds the model's %d\n", context, config->max_seq_len);
    return 2;
  }
  const int prompt = context - max_tokens;
  const KvCacheSpec whole = KvCacheSpec::For(*config, block_size, *dtype, false);
  const KvCacheSpec grouped = KvCacheSpec::For(*config, block_size, *dtype, true);
  using Admission = DecodeScheduler::Admission;
  std::vector<Result> results;
  for (Admission a : {Admission::kOnDemand, Admission::kReserve}) {
    results.push_back(Run("every layer whole", a, whole, budget, prompt, context, requests));
    results.push_back(
        Run("sliding layers keep their window", a, grouped, budget, prompt, context, requests));
  }
  const Result& full = results[0];
  const Result& windowed = results[1];
  std::printf(
      "%s: %d layers, window %d; KV budget %.2f GiB (%s), sequences of %d tokens "
      "(%d prompt + %d generated), %d requests\n",
      config->architecture.c_str(), config->n_layers, config->sliding_window,
      budget / double(int64_t{1} << 30), dtype_name.c_str(), context, prompt, max_tokens, requests);
  std::printf("%-34s %-9s %6s %10s %8s %10s %6s %6s %7s %11s\n", "KV cache", "admission", "groups",
              "blocks", "MiB/seq", "seqs fit", "peak", "mean", "steps", "preemptions");
  std::string json = "{\"model\":\"" + config->architecture +
                     "\",\"kv_bytes\":" + std::to_string(budget) + ",\"kv_dtype\":\"" + dtype_name +
                     "\",\"context\":" + std::to_string(context) +
                     ",\"max_tokens\":" + std::to_string(max_tokens) +
                     ",\"block_size\":" + std::to_string(block_size) +
                     ",\"requests\":" + std::to_string(requests) + ",\"modes\":[";
  for (const Result& result : results) {
    const Result* r = &result;
    const double mib = r->blocks_per_sequence * r->spec.bytes_per_block() / 1048576.0;
    std::printf("%-34s %-9s %6d %10d %8.1f %10lld %6d %6.1f %7lld %11lld\n", r->mode, r->admission,
                r->spec.n_groups(), r->blocks, mib, static_cast<long long>(r->sequences_fit),
                r->peak_running, r->mean_running, static_cast<long long>(r->steps),
                static_cast<long long>(r->preemptions));
    char buf[512];
    std::snprintf(buf, sizeof(buf),
                  "%s{\"mode\":\"%s\",\"admission\":\"%s\",\"groups\":%d,\"blocks\":%d,\"bytes_per_"
                  "block\":%lld,"
                  "\"mib_per_sequence\":%.2f,\"sequences_fit\":%lld,\"peak_running\":%d,"
                  "\"mean_running\":%.2f,\"steps\":%lld,\"preemptions\":%lld}",
                  r == &results[0] ? "" : ",", r->mode, r->admission, r->spec.n_groups(), r->blocks,
                  static_cast<long long>(r->spec.bytes_per_block()), mib,
                  static_cast<long long>(r->sequences_fit), r->peak_running, r->mean_running,
                  static_cast<long long>(r->steps), static_cast<long long>(r->preemptions));
    json += buf;
  }
  const double ratio = full.sequences_fit > 0
                           ? static_cast<double>(windowed.sequences_fit) / full.sequences_fit
                           : 0.0;
  const double kv_less =
      1.0 - static_cast<double>(windowed.blocks_per_sequence * windowed.spec.bytes_per_block()) /
                (full.blocks_per_sequence * full.spec.bytes_per_block());
  std::printf("windowed: %.2fx the sequences, %.1f%% less KV per %d-token sequence\n", ratio,
              100 * kv_less, context);
  char tail[128];
  std::snprintf(tail, sizeof(tail), "],\"sequences_ratio\":%.3f,\"kv_per_sequence_saved\":%.4f}\n",
                ratio, kv_less);
  json += tail;
  if (absl::Status s = tandem::WriteStringToFile(out, json); !s.ok()) {
    std::fprintf(stderr, "cannot write %s: %s\n", out.c_str(), std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
