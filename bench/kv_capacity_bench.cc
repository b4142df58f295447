// How many sequences a decode worker's KV cache holds at a fixed budget, by KV dtype: the blocks
// the decode engine sizes its cache to (KvCacheSpec::BlocksIn, what --kv-bytes becomes; fp8's
// per-block scales included) divided by the blocks one sequence of --context prompt tokens and
// --max-tokens output needs. Prints a table and writes JSON to --out
// (bench/results/kv_capacity.json). Shapes: Llama-3-8B and TinyLlama-1.1B (engine/loaders/
// model_writer.h RandomModelConfig). Flags: --kv-bytes N (default 100 GiB: an H200's 141 GB less
// the weights and the activations), --context N (4096), --max-tokens N (512), --block-size N (16).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/kv/kv_cache.h"
#include "engine/loaders/model_writer.h"
#include "formats/mapped_file.h"

int main(int argc, char** argv) {
  using tandem::DType;
  int64_t budget = int64_t{100} << 30;
  int context = 4096, max_tokens = 512, block_size = 16;
  std::string out = "bench/results/kv_capacity.json";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--kv-bytes")
      budget = std::atoll(argv[i + 1]);
    else if (flag == "--context")
      context = std::atoi(argv[i + 1]);
    else if (flag == "--max-tokens")
      max_tokens = std::atoi(argv[i + 1]);
    else if (flag == "--block-size")
      block_size = std::atoi(argv[i + 1]);
    else if (flag == "--out")
      out = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (budget <= 0 || context < 1 || max_tokens < 0 || block_size < 1) {
    std::fprintf(stderr, "--kv-bytes, --context, --block-size must be > 0, --max-tokens >= 0\n");
    return 2;
  }
  const int per_seq = (context + max_tokens + block_size - 1) / block_size;
  std::printf("KV budget %.1f GiB, sequences of %d + %d tokens (%d blocks of %d)\n",
              budget / double(int64_t{1} << 30), context, max_tokens, per_seq, block_size);
  std::string json = "{\"kv_bytes\":" + std::to_string(budget) +
                     ",\"context\":" + std::to_string(context) +
                     ",\"max_tokens\":" + std::to_string(max_tokens) +
                     ",\"block_size\":" + std::to_string(block_size) + ",\"shapes\":[";
  bool first_shape = true;
  for (const char* shape : {"Llama-3-8B", "TinyLlama-1.1B"}) {
    auto config = tandem::RandomModelConfig(shape);
    if (!config.ok()) return 1;
    json += std::string(first_shape ? "" : ",") + "{\"shape\":\"" + shape + "\",\"dtypes\":[";
    first_shape = false;
    int f32_seqs = 0;
    bool first = true;
    for (DType dt : {DType::kF32, DType::kBF16, DType::kFp8E4M3}) {
      const auto spec = tandem::KvCacheSpec::For(*config, block_size, dt);
      const int blocks = spec.BlocksIn(budget);
      const int seqs = blocks / per_seq;
      if (dt == DType::kF32) f32_seqs = seqs;
      const std::string name(tandem::DTypeName(dt));
      std::printf("%-15s %-4s %9.3f MiB a block, %7d blocks, %6d sequences (%.2fx f32)%s\n", shape,
                  name.c_str(), spec.bytes_per_block() / 1048576.0, blocks, seqs,
                  f32_seqs > 0 ? double(seqs) / f32_seqs : 0.0,
                  blocks == (1 << 20) ? "  [capped at 2^20 blocks]" : "");
      char buf[256];
      std::snprintf(buf, sizeof(buf),
                    "%s{\"kv_dtype\":\"%s\",\"bytes_per_block\":%lld,\"blocks\":%d,"
                    "\"sequences\":%d}",
                    first ? "" : ",", name.c_str(), static_cast<long long>(spec.bytes_per_block()),
                    blocks, seqs);
      json += buf;
      first = false;
    }
    json += "]}";
  }
  json += "]}\n";
  if (absl::Status s = tandem::WriteStringToFile(out, json); !s.ok()) {
    std::fprintf(stderr, "cannot write %s: %s\n", out.c_str(), std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
