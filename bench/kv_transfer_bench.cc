// kv_transfer_bench: throughput of shipping one prompt's KV cache from a prefill cache to a
// decode cache, end to end (gather, CRC32C, send, receive, verify, lease check, scatter, ACK).
// Shape: stories110M (12 layers, width 768), 512 tokens: 36 MiB per prompt in float32, half in
// bf16/f16, a quarter (plus the scales) in fp8. Sender block size 16, receiver block size 32
// with shuffled block ids. tcp and local run for every KV dtype (bytes per prompt, GB/s and
// prompts per second); the rest in f32. Also the parts alone: CRC32C (hardware and software),
// gather, scatter. Prints a table and writes JSON.
//
// The NCCL transport (kv_transfer/nccl/nccl_transport.h) twice: over the fake communicator with
// host staging (the transport's own cost on the CPU: staging copies, framing, progress threads),
// and over real NCCL from GPU 1 to GPU 0 through device staging, which needs libtandem_nccl.so
// and 2 GPUs (skipped otherwise, null in the JSON). The real figure includes the host-side pack
// and unpack and the pinned/device copies the engine's host KV needs today.
//
//   build/bin/kv_transfer_bench [--prompts 20] [--chunk_tokens 512] [--dtypes f32,bf16,f16,fp8]
//       [--out bench/results/kv_transfer_bench.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "engine/kv/block_pool.h"
#include "engine/kv/kv_cache.h"
#include "engine/model_config.h"
#include "kv_transfer/kv_pack.h"
#include "kv_transfer/kv_transfer.h"
#include "kv_transfer/lease_table.h"
#include "kv_transfer/nccl/nccl_api.h"
#include "kv_transfer/nccl/nccl_loader.h"
#include "kv_transfer/nccl/nccl_transport.h"
#include "lib/crc32c/crc32c.h"
#include "nlohmann/json.hpp"
#include "tests/kv_transfer/nccl_fake.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kLayers = 12;
constexpr int kKvHeads = 12;
constexpr int kHeadDim = 64;  // width 768
constexpr int kTokens = 512;
constexpr int kSrcBlock = 16;
constexpr int kDstBlock = 32;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

ModelConfig Shape() {
  ModelConfig c;
  c.n_layers = kLayers;
  c.n_heads = kKvHeads;
  c.n_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  return c;
}

KvCache MakeCache(int num_blocks, int block_size, DType dtype = DType::kF32) {
  KvCache c = *KvCache::Create(Shape(), num_blocks, block_size, 0, dtype);
  const int64_t n = int64_t{num_blocks} * block_size * c.width();
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int l = 0; l < c.n_layers(); ++l) {
    if (dtype == DType::kF32) {
      std::generate(c.k(l), c.k(l) + n, [&] { return u(rng); });
      std::generate(c.v(l), c.v(l) + n, [&] { return u(rng); });
      continue;
    }
    // The transfer copies bytes: any bytes do.
    const int64_t bytes = n * static_cast<int64_t>(DTypeSize(dtype));
    std::generate(c.k_bytes(l), c.k_bytes(l) + bytes, [&] { return static_cast<char>(rng()); });
    std::generate(c.v_bytes(l), c.v_bytes(l) + bytes, [&] { return static_cast<char>(rng()); });
    if (float* s = c.scales(l)) std::fill(s, s + int64_t{num_blocks} * 2 * kKvHeads, 0.01f);
  }
  return c;
}

// The decode side, as the decode node will do it: lease check and scatter under one lock.
class Sink : public KvSink {
 public:
  Sink(int prompts, DType dtype)
      : cache_(MakeCache(prompts * kTokens / kDstBlock, kDstBlock, dtype)) {}

  KvTarget Admit(const std::string& endpoint, std::vector<int> blocks) {
    absl::MutexLock lock(&mu_);
    Lease l = *leases_.Create(std::move(blocks), kTokens, kLayers, absl::InfiniteFuture());
    return {endpoint, l.id, l.generation, l.capability};
  }
  absl::Status CheckHeader(const KvChunkHeader& h) override {
    absl::MutexLock lock(&mu_);
    return leases_.CheckChunk(h).status();
  }
  absl::Status Accept(const KvChunkHeader& h, std::span<const char> payload) override {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<std::span<const int>> blocks = leases_.CheckChunk(h);
    if (!blocks.ok()) return blocks.status();
    if (absl::Status s = ScatterKv(payload, h, *blocks, &cache_); !s.ok()) return s;
    return leases_.OnChunk(h);
  }
  void Release(uint64_t id) {
    absl::MutexLock lock(&mu_);
    leases_.Release(id).IgnoreError();
  }

 private:
  absl::Mutex mu_;
  KvCache cache_;
  LeaseTable leases_;
};

struct Transport {
  std::unique_ptr<KvSender> sender;
  std::unique_ptr<KvReceiver> receiver;
};
using MakeTransport = std::function<Transport(KvSink*)>;

// tcp proves a cluster secret at connection start (once per connection, outside the timing).
MakeTransport Plain(std::string kind, std::string address) {
  return [kind, address](KvSink* sink) {
    const ClusterSecret secret = ClusterSecret::Generate();
    KvReceiverOptions ro;
    ro.auth.secret = secret;
    KvSenderOptions so;
    so.auth.secret = secret;
    Transport t;
    t.receiver = *MakeKvReceiver(kind, address, sink, ro);
    t.sender = *MakeKvSender(kind, so);
    return t;
  };
}

// The NCCL transport from `prefill` parts to `decode` parts, bootstrapped in process.
MakeTransport Nccl(std::function<NcclTransportParts()> prefill,
                   std::function<NcclTransportParts()> decode) {
  return [prefill, decode](KvSink* sink) {
    std::unique_ptr<NcclKvTransportReceiver> r = MakeNcclKvReceiver(decode(), sink);
    r->SetBootstrapAddress("127.0.0.1:1");
    NcclKvTransportReceiver* rp = r.get();
    Transport t;
    t.sender = *MakeNcclKvSender(
        prefill(), [rp](const std::string&) { return rp->Bootstrap("kv_transfer_bench"); });
    t.receiver = std::move(r);
    return t;
  };
}

struct Shipped {
  double gb_per_s = 0;       // payload, 1e9 bytes per second
  double prompts_per_s = 0;  // whole prompts' KV delivered and acknowledged
  uint64_t bytes_per_prompt = 0;
};

// Ships `prompts` prompts one after another (each: every layer in chunks, then Wait) in `dtype`.
Shipped Ship(const MakeTransport& make, int prompts, int chunk_tokens, DType dtype) {
  const KvCache src = MakeCache(kTokens / kSrcBlock, kSrcBlock, dtype);
  std::vector<int> src_table(kTokens / kSrcBlock);
  std::iota(src_table.begin(), src_table.end(), 0);
  std::reverse(src_table.begin(), src_table.end());

  Sink sink(prompts, dtype);
  Transport transport = make(&sink);
  KvSender* sender = transport.sender.get();
  KvReceiver* receiver = transport.receiver.get();
  std::vector<int> dst_ids(prompts * kTokens / kDstBlock);
  std::iota(dst_ids.begin(), dst_ids.end(), 0);
  std::shuffle(dst_ids.begin(), dst_ids.end(), std::mt19937(2));

  // One warm-up prompt (connection set-up, first-touch of pages) is not timed.
  double seconds = 0;
  uint64_t bytes = 0;
  for (int p = -1; p < prompts; ++p) {
    const int slot = std::max(p, 0);
    const int per = kTokens / kDstBlock;
    std::vector<int> blocks(dst_ids.begin() + slot * per, dst_ids.begin() + (slot + 1) * per);
    const uint64_t id = static_cast<uint64_t>(p + 2);
    const KvTarget target = sink.Admit(receiver->endpoint(), blocks);
    const Clock::time_point t0 = Clock::now();
    for (int l = 0; l < kLayers; ++l) {
      for (int s = 0; s < kTokens; s += chunk_tokens) {
        const int n = std::min(chunk_tokens, kTokens - s);
        std::string payload = *GatherKv(src, l, src_table, s, n);
        if (p >= 0) bytes += payload.size();
        absl::Status st =
            sender->Send(target, MakeKvChunkHeader(src, id, l, s, n), std::move(payload));
        if (!st.ok()) std::fprintf(stderr, "send: %s\n", std::string(st.message()).c_str());
      }
    }
    absl::Status st = sender->Wait(target, absl::Now() + absl::Seconds(60));
    const Clock::time_point t1 = Clock::now();
    if (!st.ok()) std::fprintf(stderr, "wait: %s\n", std::string(st.message()).c_str());
    if (p >= 0) seconds += Seconds(t0, t1);
    sender->Forget(target);
    sink.Release(target.lease_id);
  }
  sender->Shutdown();
  receiver->Shutdown();
  return {bytes / seconds / 1e9, prompts / seconds, bytes / static_cast<uint64_t>(prompts)};
}

double ShipGbPerSecond(const MakeTransport& make, int prompts, int chunk_tokens) {
  return Ship(make, prompts, chunk_tokens, DType::kF32).gb_per_s;
}

// Best of `reps` of fn(), which processes `bytes`; GB/s.
template <typename Fn>
double BestGbPerSecond(uint64_t bytes, int reps, Fn fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const Clock::time_point t0 = Clock::now();
    fn();
    best = std::min(best, Seconds(t0, Clock::now()));
  }
  return bytes / best / 1e9;
}

struct BenchFlags {
  int prompts = 20;
  int chunk_tokens = kTokens;
  std::vector<DType> dtypes;
  std::string out = std::string(TANDEM_SOURCE_DIR) + "/bench/results/kv_transfer_bench.json";
};

// Reads the flags into `flags` (every KV dtype when --dtypes names none); false (with a message)
// on a bad one.
bool ParseFlags(int argc, char** argv, BenchFlags* flags) {
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string_view flag = argv[i];
    if (flag == "--prompts") {
      flags->prompts = std::atoi(argv[i + 1]);
    } else if (flag == "--chunk_tokens") {
      flags->chunk_tokens = std::atoi(argv[i + 1]);
    } else if (flag == "--out") {
      flags->out = argv[i + 1];
    } else if (flag == "--dtypes") {
      for (const std::string& name :
           std::vector<std::string>(absl::StrSplit(argv[i + 1], ',', absl::SkipEmpty()))) {
        auto d = ParseKvDtype(name);
        if (!d.ok() || name == "auto") {
          std::fprintf(stderr, "--dtypes: f32, bf16, f16 or fp8, not %s\n",
                       std::string(name).c_str());
          return false;
        }
        flags->dtypes.push_back(*d);
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", argv[i]);
      return false;
    }
  }
  if (flags->prompts <= 0 || flags->chunk_tokens <= 0 || flags->chunk_tokens > kTokens) {
    std::fprintf(stderr, "--prompts must be > 0 and --chunk_tokens in [1, %d]\n", kTokens);
    return false;
  }
  if (flags->dtypes.empty()) {
    flags->dtypes = {DType::kF32, DType::kBF16, DType::kF16, DType::kFp8E4M3};
  }
  return true;
}

// The parts alone on one f32 layer of the prompt, GB/s.
struct PartFigures {
  size_t layer_bytes = 0;
  double crc_hw = 0;  // 0 without the hardware instruction
  double crc_sw = 0;
  double gather = 0;
  double scatter = 0;
};

PartFigures MeasureParts() {
  PartFigures parts;
  const KvCache src = MakeCache(kTokens / kSrcBlock, kSrcBlock);
  std::vector<int> table(kTokens / kSrcBlock);
  std::iota(table.begin(), table.end(), 0);
  const std::string layer = *GatherKv(src, 0, table, 0, kTokens);  // 3 MiB
  parts.layer_bytes = layer.size();
  volatile uint32_t sink_crc = 0;
  parts.crc_hw =
      Crc32cHardwareAvailable()
          ? BestGbPerSecond(layer.size(), 20,
                            [&] { sink_crc = Crc32cHardwareExtend(0, layer.data(), layer.size()); })
          : 0;
  parts.crc_sw = BestGbPerSecond(
      layer.size(), 20, [&] { sink_crc = Crc32cSoftwareExtend(0, layer.data(), layer.size()); });
  parts.gather = BestGbPerSecond(layer.size(), 20, [&] {
    std::string p = *GatherKv(src, 0, table, 0, kTokens);
    sink_crc = p[0];
  });
  KvCache dst = MakeCache(kTokens / kDstBlock, kDstBlock);
  std::vector<int> dst_table(kTokens / kDstBlock);
  std::iota(dst_table.begin(), dst_table.end(), 0);
  const KvChunkHeader h = MakeKvChunkHeader(src, 1, 0, 0, kTokens);
  parts.scatter = BestGbPerSecond(layer.size(), 20,
                                  [&] { ScatterKv(layer, h, dst_table, &dst).IgnoreError(); });
  return parts;
}

struct PerDtype {
  DType dtype;
  Shipped tcp, local;
};

// The transports end to end: every KV dtype over tcp and local, then f32 over tcp, local, NCCL's
// fake communicator and real NCCL (when two GPUs and libtandem_nccl.so are there).
struct EndToEnd {
  std::vector<PerDtype> per_dtype;
  double tcp = 0, local = 0, nccl_fake = 0;  // GB/s
  std::optional<double> nccl;
  std::string nccl_skip;  // why `nccl` is empty
};

EndToEnd MeasureEndToEnd(const BenchFlags& flags) {
  const int prompts = flags.prompts, chunk_tokens = flags.chunk_tokens;
  EndToEnd e;
  for (DType d : flags.dtypes) {
    e.per_dtype.push_back({d, Ship(Plain("tcp", "127.0.0.1:0"), prompts, chunk_tokens, d),
                           Ship(Plain("local", "kv-bench"), prompts, chunk_tokens, d)});
  }
  e.tcp = ShipGbPerSecond(Plain("tcp", "127.0.0.1:0"), prompts, chunk_tokens);
  e.local = ShipGbPerSecond(Plain("local", "kv-bench"), prompts, chunk_tokens);
  testing::FakeNccl fake;
  auto fake_parts = [&fake] {
    NcclTransportParts p;
    p.factory = std::shared_ptr<CommunicatorFactory>(&fake, [](CommunicatorFactory*) {});
    p.staging = MakeHostKvStaging();
    return p;
  };
  e.nccl_fake = ShipGbPerSecond(Nccl(fake_parts, fake_parts), prompts, chunk_tokens);
  // Real NCCL: prefill on GPU 1, decode on GPU 0.
  absl::StatusOr<const TandemNcclApi*> api = LoadNcclApi();
  if (!api.ok()) {
    e.nccl_skip = std::string(api.status().message());
  } else if ((*api)->device_count() < 2) {
    e.nccl_skip = absl::StrFormat("needs 2 GPUs, %d visible", (*api)->device_count());
  } else {
    auto on = [](int device) { return [device] { return *LoadNcclTransport(device); }; };
    e.nccl = ShipGbPerSecond(Nccl(on(1), on(0)), prompts, chunk_tokens);
  }
  return e;
}

// Prints the table of figures.
void PrintFigures(const BenchFlags& flags, const PartFigures& parts, const EndToEnd& e) {
  const double prompt_mib = double{kLayers} * parts.layer_bytes / (1 << 20);
  std::printf(
      "kv_transfer_bench: %d layers x width %d x %d tokens f32 = %.1f MiB per prompt, "
      "%d-token chunks, %d prompts\n",
      kLayers, kKvHeads * kHeadDim, kTokens, prompt_mib, flags.chunk_tokens, flags.prompts);
  std::printf("  tcp loopback end to end   %6.2f GB/s\n", e.tcp);
  std::printf("  local end to end          %6.2f GB/s\n", e.local);
  std::printf("  nccl fake comm, host stage %5.2f GB/s\n", e.nccl_fake);
  if (e.nccl) {
    std::printf("  nccl GPU1->GPU0 end to end %5.2f GB/s\n", *e.nccl);
  } else {
    std::printf("  nccl GPU1->GPU0 end to end skipped: %s\n", e.nccl_skip.c_str());
  }
  std::printf("  per KV dtype: bytes per prompt, then tcp and local GB/s and prompts/s\n");
  for (const PerDtype& d : e.per_dtype) {
    std::printf(
        "    %-5s %6.2f MiB   tcp %6.2f GB/s %7.1f prompts/s   local %6.2f GB/s %7.1f "
        "prompts/s\n",
        std::string(DTypeName(d.dtype)).c_str(), d.tcp.bytes_per_prompt / 1048576.0, d.tcp.gb_per_s,
        d.tcp.prompts_per_s, d.local.gb_per_s, d.local.prompts_per_s);
  }
  std::printf("  crc32c sse4.2             %6.2f GB/s\n", parts.crc_hw);
  std::printf("  crc32c software           %6.2f GB/s\n", parts.crc_sw);
  std::printf("  gather (block 16)         %6.2f GB/s\n", parts.gather);
  std::printf("  scatter (block 32)        %6.2f GB/s\n", parts.scatter);
}

// The figures as the JSON the benchmark writes.
nlohmann::json FiguresJson(const BenchFlags& flags, const PartFigures& parts, const EndToEnd& e) {
  nlohmann::json j;
  j["benchmark"] = "kv_transfer_bench";
  j["hardware_concurrency"] = std::thread::hardware_concurrency();
  j["shape"] = {{"n_layers", kLayers},
                {"width", kKvHeads * kHeadDim},
                {"tokens", kTokens},
                {"dtype", "f32"},
                {"bytes_per_prompt", kLayers * parts.layer_bytes},
                {"sender_block_size", kSrcBlock},
                {"receiver_block_size", kDstBlock}};
  j["chunk_tokens"] = flags.chunk_tokens;
  j["prompts"] = flags.prompts;
  j["gb_per_s"] = {{"tcp_end_to_end", e.tcp},
                   {"local_end_to_end", e.local},
                   {"crc32c_sse42", parts.crc_hw},
                   {"crc32c_software", parts.crc_sw},
                   {"gather", parts.gather},
                   {"scatter", parts.scatter},
                   {"nccl_fake_host_staging_end_to_end", e.nccl_fake}};
  j["gb_per_s"]["nccl_gpu1_to_gpu0_end_to_end"] =
      e.nccl ? nlohmann::json(*e.nccl) : nlohmann::json(nullptr);
  if (!e.nccl) j["nccl_skipped"] = e.nccl_skip;
  for (const PerDtype& d : e.per_dtype) {
    j["per_kv_dtype"][std::string(DTypeName(d.dtype))] = {
        {"bytes_per_prompt", d.tcp.bytes_per_prompt},
        {"tcp_gb_per_s", d.tcp.gb_per_s},
        {"tcp_prompts_per_s", d.tcp.prompts_per_s},
        {"local_gb_per_s", d.local.gb_per_s},
        {"local_prompts_per_s", d.local.prompts_per_s}};
  }
  j["units"] = "GB/s = 1e9 payload bytes per second";
  return j;
}

int Main(int argc, char** argv) {
  BenchFlags flags;
  if (!ParseFlags(argc, argv, &flags)) return 2;
  const PartFigures parts = MeasureParts();
  const EndToEnd e = MeasureEndToEnd(flags);
  PrintFigures(flags, parts, e);
  const nlohmann::json j = FiguresJson(flags, parts, e);
  std::ofstream(flags.out) << j.dump(2) << "\n";
  std::printf("wrote %s\n", flags.out.c_str());
  return 0;
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) { return tandem::Main(argc, argv); }
