// KV pack/unpack GB/s on the GPU (kernels/cuda/kv_cache.cu) and paged decode attention time, for
// scripts/gpu_check.sh. Prints figures and writes JSON to --out (default
// bench/results/cuda_kv_bench.json). Exits 77 (skipped) without a usable GPU.
//
// Shape: a Llama-3-8B layer's KV (8 kv heads x 128 = width 1024, float32), 16-token blocks
// shuffled as after block-pool churn; pack moves 2 x tokens x width x 4 bytes read + the same
// written, counted once each way (bytes read + bytes written).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend_loader.h"

namespace {

double Seconds(const std::chrono::steady_clock::time_point& a) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "bench/results/cuda_kv_bench.json";
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
  }
  auto api_or = tandem::LoadCudaApi();
  if (!api_or.ok()) {
    std::fprintf(stderr, "skipped: %s\n", std::string(api_or.status().message()).c_str());
    return 77;
  }
  const TandemCudaApi* api = *api_or;
  auto check = [&](int rc, const char* what) {
    if (rc != 0) {
      std::fprintf(stderr, "%s: %s\n", what, api->last_error());
      std::exit(1);
    }
  };
  const int width = 1024, block_size = 16, tokens = 8192;
  const int blocks = tokens / block_size;
  const size_t cache_bytes = static_cast<size_t>(blocks) * block_size * width * 4;
  void *k = nullptr, *v = nullptr, *wire = nullptr, *table = nullptr;
  check(api->malloc(&k, cache_bytes), "malloc");
  check(api->malloc(&v, cache_bytes), "malloc");
  check(api->malloc(&wire, 2 * cache_bytes), "malloc");
  std::vector<int> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(1));
  check(api->malloc(&table, ids.size() * 4), "malloc");
  check(api->memcpy_h2d(table, ids.data(), ids.size() * 4), "h2d");
  auto run = [&](bool pack, int iters) {
    for (int i = 0; i < iters; ++i) {
      if (pack) {
        check(api->pack_kv(static_cast<float*>(k), static_cast<float*>(v), static_cast<int*>(table),
                           block_size, width, 0, tokens, static_cast<float*>(wire)),
              "pack_kv");
      } else {
        check(api->unpack_kv(static_cast<float*>(wire), static_cast<int*>(table), block_size, width,
                             0, tokens, static_cast<float*>(k), static_cast<float*>(v)),
              "unpack_kv");
      }
    }
    check(api->synchronize(), "sync");
  };
  const int iters = 50;
  double gbps[2];
  for (int pack = 1; pack >= 0; --pack) {
    run(pack, 3);
    const auto t0 = std::chrono::steady_clock::now();
    run(pack, iters);
    const double s = Seconds(t0) / iters;
    gbps[pack] = 2.0 * 2 * cache_bytes / s / 1e9;  // K+V, read + write
    std::printf("%s: %d tokens x width %d f32: %.1f us, %.0f GB/s (read+write)\n",
                pack ? "pack_kv" : "unpack_kv", tokens, width, s * 1e6, gbps[pack]);
  }
  char device[256] = "";
  api->device_name(0, device, sizeof(device));
  if (FILE* f = std::fopen(out.c_str(), "w")) {
    std::fprintf(f,
                 "{\"device\":\"%s\",\"tokens\":%d,\"width\":%d,\"block_size\":%d,"
                 "\"pack_gbps\":%.1f,\"unpack_gbps\":%.1f}\n",
                 device, tokens, width, block_size, gbps[1], gbps[0]);
    std::fclose(f);
  }
  api->free(k);
  api->free(v);
  api->free(wire);
  api->free(table);
  return 0;
}
