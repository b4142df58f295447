// The device-resident model (engine/cuda/device_model.cu through engine/model_runner.h)
// against the CPU model, its twin: stories260K with f32 and bf16 weights, block sizes 16 and 64,
// mixed batches of chunked prefills (start_pos > 0) and decodes, KV pack / unpack, graph replay
// against plain steps; and models of head_dim 64 and 128 with bf16 and fp8 KV caches (attention
// by FlashInfer) against the CPU model with the same cache dtype. Skipped where no GPU (or no CUDA
// library) is present; scripts/ gpu_check.sh runs them on a machine with one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "absl/strings/str_format.h"
#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "engine/model_runner.h"
#include "kernels/backend_loader.h"
#include "kernels/dtype.h"
#include "kv_transfer/runner_kv.h"
#include "tests/kernels/cuda_device_test.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

class CudaModelTest : public testing::CudaDeviceTest {
 protected:
  void SetUp() override {
    CudaDeviceTest::SetUp();
    if (IsSkipped()) return;
    backend_ = MakeCpuBackend(4);
  }
  std::unique_ptr<Model> Load(DType dtype) {
    auto m = Model::Load(testing::Stories260K(), backend_.get(), dtype);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }
  // GraphReplayEqualsPlainSteps for one weight dtype.
  void GraphReplayCase(int weight_dtype);
  std::unique_ptr<Backend> backend_;
};

// max |a - b| / max |b| over the rows.
double NormErr(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, static_cast<double>(std::abs(a[i] - b[i])));
    den = std::max(den, static_cast<double>(std::abs(b[i])));
  }
  return num / den;
}

int Argmax(std::span<const float> row) {
  return static_cast<int>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Top-1 minus top-2 logit.
float Margin(std::span<const float> row) {
  std::vector<float> v(row.begin(), row.end());
  std::partial_sort(v.begin(), v.begin() + 2, v.end(), std::greater<float>());
  return v[0] - v[1];
}

// Runs the same schedule on the CPU runner and the CUDA runner: three sequences, the first
// prefilled in two chunks (the second at start_pos > 0, as after a prefix hit or chunked
// prefill) mixed with the others' prefill, then `steps` greedy decode steps of all three,
// teacher-forced with the CPU's tokens so both see the same inputs. Checks logits within `tol`
// (normalized) and equal greedy tokens wherever the CPU's top-2 margin exceeds twice the
// observed absolute error (a near-tie may legitimately flip).
// The packed KV chunk `payload` (kv_transfer/kv_pack.h GatherKv's layout) of a cache of `dt`
// with `heads` KV heads of `head_dim`, as float32 values (fp8: times their scales).
std::vector<float> PayloadFloats(const std::string& payload, DType dt, int heads, int head_dim) {
  const size_t scale_bytes = dt == DType::kFp8E4M3 ? 2 * heads * 4 : 0;
  const size_t n = (payload.size() - scale_bytes) / DTypeSize(dt);
  std::vector<float> out(n);
  ConvertToF32(dt, payload.data(), out.data(), n);
  if (dt == DType::kFp8E4M3) {
    std::vector<float> scales(2 * heads);  // [K/V, head]
    std::memcpy(scales.data(), payload.data() + n, scale_bytes);
    const size_t half = n / 2, width = static_cast<size_t>(heads) * head_dim;
    for (size_t i = 0; i < n; ++i) {
      out[i] *= scales[(i / half) * heads + (i % half) % width / head_dim];
    }
  }
  return out;
}

void CompareRunners(const Model& model, int block_size, double tol, int steps,
                    DType kv_dtype = DType::kF32) {
  const ModelConfig& c = model.config();
  ModelRunnerOptions o;
  o.kv_dtype = kv_dtype;
  o.block_size = block_size;
  o.num_blocks = 3 * ((c.max_seq_len + block_size - 1) / block_size);
  o.max_batch_tokens = 256;
  o.max_seqs = 8;
  o.max_logit_rows = 64;  // step 1 asks for 42 rows
  auto cpu = MakeModelRunner("cpu", &model, o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = MakeModelRunner("cuda", &model, o);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const int per_seq = o.num_blocks / 3;
  std::vector<std::vector<int>> tables(3);
  for (int s = 0; s < 3; ++s) {
    // Interleaved block ids: sequence s owns blocks s, s + 3, s + 6, ...
    for (int b = 0; b < per_seq; ++b) tables[s].push_back(s + 3 * b);
  }
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> tok(1, c.vocab_size - 1);
  std::vector<std::vector<int>> seqs = {std::vector<int>(70), std::vector<int>(33),
                                        std::vector<int>(5)};
  for (auto& s : seqs) {
    for (int& t : s) t = tok(rng);
  }
  auto run = [&](std::span<const SequenceChunk> batch, const char* what,
                 std::vector<float>* want_out = nullptr) {
    std::vector<float> want, got;
    ASSERT_TRUE((*cpu)->Forward(batch, &want).ok());
    absl::Status st = (*gpu)->Forward(batch, &got);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(got.size(), want.size());
    const double err = NormErr(got, want);
    EXPECT_LT(err, tol) << what;
    double abs_err = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      abs_err = std::max(abs_err, static_cast<double>(std::abs(got[i] - want[i])));
    }
    const int rows = static_cast<int>(want.size() / c.vocab_size);
    for (int r = 0; r < rows; ++r) {
      std::span<const float> w(want.data() + r * c.vocab_size, c.vocab_size);
      std::span<const float> g(got.data() + r * c.vocab_size, c.vocab_size);
      if (Margin(w) > 2 * abs_err) {
        EXPECT_EQ(Argmax(g), Argmax(w)) << what << " row " << r;
      }
    }
    if (want_out != nullptr) *want_out = std::move(want);
  };
  {
    // Step 1: sequence 0's first 40 tokens with every row's logits, sequences 1 and 2 whole.
    std::vector<SequenceChunk> b = {{std::span<const int>(seqs[0]).first(40), 0, tables[0], true},
                                    {seqs[1], 0, tables[1], false},
                                    {seqs[2], 0, tables[2], false}};
    run(b, "prefill step 1");
  }
  {
    // Step 2: the rest of sequence 0 (start_pos 40) alone.
    std::vector<SequenceChunk> b = {{std::span<const int>(seqs[0]).subspan(40), 40, tables[0]}};
    run(b, "prefill step 2 (start_pos 40)");
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<SequenceChunk> b;
    for (int s = 0; s < 3; ++s) {
      const int pos = static_cast<int>(seqs[s].size()) - 1;
      b.push_back({std::span<const int>(seqs[s]).subspan(pos, 1), pos, tables[s]});
    }
    std::vector<float> want;
    run(b, "decode", &want);
    ASSERT_FALSE(want.empty());
    for (int s = 0; s < 3; ++s) {
      seqs[s].push_back(
          Argmax(std::span<const float>(want.data() + s * c.vocab_size, c.vocab_size)));
    }
  }
  // The KV the device wrote, packed for transfer, matches the CPU cache's.
  for (int layer : {0, c.n_layers - 1}) {
    auto want = PackRunnerKv(**cpu, layer, tables[0], 3, 60);
    auto got = PackRunnerKv(**gpu, layer, tables[0], 3, 60);
    ASSERT_TRUE(want.ok() && got.ok());
    ASSERT_EQ(want->size(), got->size()) << "packed KV, layer " << layer;
    const std::vector<float> w = PayloadFloats(*want, kv_dtype, c.n_kv_heads, c.head_dim);
    const std::vector<float> g = PayloadFloats(*got, kv_dtype, c.n_kv_heads, c.head_dim);
    EXPECT_LT(NormErr(g, w), tol) << "packed KV, layer " << layer;
  }
}

// f32: every op in f32 on both sides; only summation order and fast intrinsics differ (~1e-6
// relative per op), so 1e-3 of the largest logit over 5 layers is ample and still far below
// any real mistake (which moves logits by O(1)).
TEST_F(CudaModelTest, Stories260KF32MatchesCpuBlock16) {
  auto model = Load(DType::kF32);
  ASSERT_NE(model, nullptr);
  CompareRunners(*model, 16, 1e-3, 12);
}

TEST_F(CudaModelTest, Stories260KF32MatchesCpuBlock64) {
  auto model = Load(DType::kF32);
  ASSERT_NE(model, nullptr);
  CompareRunners(*model, 64, 1e-3, 6);
}

// bf16 weights (the same rounded weights on both sides); the GPU also rounds each GEMM's input
// to bf16 (relative error up to 2^-9 per element), the CPU does not: about 1e-3 of each GEMM's
// output, over 7 GEMMs x 5 layers and the classifier; 5e-2 of the largest logit bounds that
// while any real mistake (a wrong row, head or position) moves logits by O(1).
TEST_F(CudaModelTest, Stories260KBf16MatchesCpu) {
  auto model = Load(DType::kBF16);
  ASSERT_NE(model, nullptr);
  CompareRunners(*model, 16, 5e-2, 12);
}

// A random model of Llama shape with heads of `head_dim` (64: SmolLM2's; 128: Llama 3's), GQA
// groups of 2, bf16 weights, written and loaded as a Hugging Face directory.
std::unique_ptr<Model> RandomModel(Backend* backend, int head_dim, testing::TempDir* dir) {
  auto c = RandomModelConfig("stories260K");
  EXPECT_TRUE(c.ok());
  c->n_heads = 4;
  c->n_kv_heads = 2;
  c->head_dim = head_dim;
  c->dim = 4 * head_dim;
  c->hidden_dim = 2 * c->dim;
  c->n_layers = 3;
  c->tie_word_embeddings = false;
  EXPECT_TRUE(WriteRandomModel(*c, DType::kBF16, 11, dir->path()).ok());
  auto m = Model::Load(dir->path(), backend, DType::kBF16);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? std::move(*m) : nullptr;
}

// bf16 and fp8 KV caches on the device (attention by FlashInfer) against the CPU model with the
// same cache dtype. The caches hold the same rounding of slightly different K/V (the GPU's GEMMs
// round their input to bf16), the GPU's attention rounds its queries, softmax weights and output
// to bf16 (relative 2^-9 each): about 1e-2 of the largest logit over 3 layers and the classifier;
// fp8 adds its rounding of values that differ by that much (2^-4 relative, where a K/V value sits
// near a rounding boundary). 5e-2 (bf16) and 1.5e-1 (fp8) bound these while a wrong block, head,
// position or scale moves logits by O(1); greedy tokens must agree wherever the margin exceeds
// twice the observed error.
TEST_F(CudaModelTest, Bf16AndFp8KvCachesMatchCpu) {
  for (int hd : {64, 128}) {
    for (DType dt : {DType::kBF16, DType::kFp8E4M3}) {
      const char* why = "";
      const int code = dt == DType::kBF16 ? TANDEM_KV_BF16 : TANDEM_KV_FP8;
      if (api_->fi_attention_supported(hd, code, &why) == 0) {
        GTEST_SKIP() << "no FlashInfer attention in this library: " << why;
      }
      testing::TempDir dir;
      auto model = RandomModel(backend_.get(), hd, &dir);
      ASSERT_NE(model, nullptr);
      SCOPED_TRACE(absl::StrFormat("head_dim %d, kv %s", hd, DTypeName(dt)));
      CompareRunners(*model, hd == 64 ? 16 : 64, dt == DType::kBF16 ? 5e-2 : 1.5e-1, 8, dt);
    }
  }
}

// The runner's device sampling: greedy rows are the argmax of the same step's logits, and a
// seeded row is the token engine/sampling/sampler.cc Sample draws from those logits (the sampler
// twin test covers the draw itself; here, the rows and positions reach it in order).
TEST_F(CudaModelTest, ForwardSampleDrawsFromTheStepsLogits) {
  auto model = Load(DType::kF32);
  ASSERT_NE(model, nullptr);
  ModelRunnerOptions o;
  o.num_blocks = 64;
  auto a = MakeModelRunner("cuda", model.get(), o);
  auto b = MakeModelRunner("cuda", model.get(), o);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->samples_on_device());
  const std::vector<int> t0 = {1, 20, 30}, t1 = {1, 40}, table0 = {0}, table1 = {1};
  std::vector<SequenceChunk> batch = {{t0, 0, table0}, {t1, 0, table1}};
  std::vector<float> logits;
  ASSERT_TRUE((*a)->Forward(batch, &logits).ok());
  SamplingParams greedy, seeded;
  greedy.temperature = 0;
  seeded.temperature = 0.9f;
  seeded.top_p = 0.95f;
  seeded.seed = 7;
  const std::vector<SamplingParams> params = {greedy, seeded};
  const std::vector<uint64_t> positions = {3, 2};
  std::vector<int> tokens;
  absl::Status st = (*b)->ForwardSample(batch, params, positions, &tokens);
  ASSERT_TRUE(st.ok()) << st;
  ASSERT_EQ(tokens.size(), 2u);
  const int vocab = model->config().vocab_size;
  EXPECT_EQ(tokens[0], Argmax(std::span<const float>(logits.data(), vocab)));
  EXPECT_EQ(tokens[1], Sample(std::span<const float>(logits.data() + vocab, vocab), seeded, 2));
  EXPECT_FALSE((*b)->ForwardSample(batch, {params.data(), 1}, positions, &tokens).ok());
}

TEST_F(CudaModelTest, BadStepsAreRejectedNamingTheChunk) {
  auto model = Load(DType::kF32);
  ASSERT_NE(model, nullptr);
  ModelRunnerOptions o;
  o.num_blocks = 64;
  auto gpu = MakeModelRunner("cuda", model.get(), o);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const std::vector<int> bad = {1, model->config().vocab_size}, table = {0};
  std::vector<SequenceChunk> b = {{bad, 0, table}};
  std::vector<float> logits;
  absl::Status st = (*gpu)->Forward(b, &logits);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sequence 0: token id 512"), std::string::npos) << st;
  const std::vector<int> ok = {1, 2}, far = {64};
  b = {{ok, 0, far}};
  st = (*gpu)->Forward(b, &logits);
  EXPECT_NE(st.message().find("block id 64 out of range"), std::string::npos) << st;
  EXPECT_FALSE(PackRunnerKv(**gpu, 0, far, 0, 1).ok());
  EXPECT_FALSE(PackRunnerKv(**gpu, 99, table, 0, 1).ok());
}

// A model of random weights made on the device, run through the C API: the same decode steps
// with graphs (padded to the bucket, captured after its first step, then replayed) and without must
// give the same logits and tokens; the library says how many buckets it captured and replayed.
// f32 and bf16 weights (weight_dtype 0 and 2).
TEST_F(CudaModelTest, GraphReplayEqualsPlainSteps) {
  for (int weight_dtype : {0, 2}) {
    SCOPED_TRACE(::testing::Message() << "weight_dtype " << weight_dtype);
    GraphReplayCase(weight_dtype);
  }
}

void CudaModelTest::GraphReplayCase(int weight_dtype) {
  const std::vector<float> inv_freq = {1.f, 0.3f, 0.1f, 0.03f, 0.01f, 0.003f, 0.001f, 0.0003f};
  TandemModelDesc d{};
  d.dim = 128;
  d.hidden_dim = 256;
  d.n_layers = 2;
  d.n_heads = 8;
  d.n_kv_heads = 2;
  d.head_dim = 16;
  d.vocab_size = 1000;
  d.max_seq_len = 1024;
  d.norm_eps = 1e-5f;
  d.rope_style = 1;
  d.rope_inv_freq = inv_freq.data();
  d.weight_dtype = weight_dtype;
  d.num_blocks = 64 * 8;
  d.block_size = 16;
  d.max_batch_tokens = 512;  // the first step prefills 5 x 100 tokens
  d.max_seqs = 16;
  d.max_logit_rows = 256;
  TandemModel* with = nullptr;
  TandemModel* without = nullptr;
  d.use_graphs = 1;
  ASSERT_EQ(api_->model_create(&d, nullptr, 42, &with), 0) << api_->last_error();
  d.use_graphs = 0;
  ASSERT_EQ(api_->model_create(&d, nullptr, 42, &without), 0) << api_->last_error();
  const int nseq = 5, ctx = 100;
  std::vector<int> tables(nseq * 8);
  std::iota(tables.begin(), tables.end(), 0);
  std::vector<int> tokens(nseq * ctx);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>(i * 7919 % 1000);
  std::vector<TandemStepChunk> chunks(nseq);
  for (int s = 0; s < nseq; ++s) chunks[s] = {ctx, 0, 8, 0};
  std::vector<float> a(nseq * 1000), b(nseq * 1000);
  int rows = 0;
  for (TandemModel* m : {with, without}) {
    ASSERT_EQ(api_->model_forward(m, chunks.data(), nseq, tokens.data(), tables.data(), nullptr,
                                  a.data(), nullptr, &rows),
              0)
        << api_->last_error();
  }
  std::vector<int> last(nseq, 3);
  for (int step = 0; step < 6; ++step) {
    const int n = step % 2 == 0 ? nseq : 3;  // buckets 8 and 4
    for (int s = 0; s < n; ++s) chunks[s] = {1, ctx + step, 8, 0};
    ASSERT_EQ(api_->model_forward(with, chunks.data(), n, last.data(), tables.data(), nullptr,
                                  a.data(), nullptr, &rows),
              0)
        << api_->last_error();
    ASSERT_EQ(rows, n);
    ASSERT_EQ(api_->model_forward(without, chunks.data(), n, last.data(), tables.data(), nullptr,
                                  b.data(), nullptr, &rows),
              0)
        << api_->last_error();
    a.resize(n * 1000);
    b.resize(n * 1000);
    // Same kernels on the same data; only the summation order may differ (cuBLAS's algorithm
    // for the padded row count, the decode attention's partitions for the padded batch and
    // context): 1e-5 relative in f32. With bf16 weights each GEMM rounds its input to bf16,
    // and a 1e-7 change can move a value across a rounding boundary (2^-9 of that value):
    // 2e-3 of the largest logit, still far below what a wrong row or position gives.
    const double tol = weight_dtype == 0 ? 1e-5 : 2e-3;
    EXPECT_LT(NormErr(a, b), tol) << "step " << step;
    float largest = 0;
    for (float v : b) largest = std::max(largest, std::abs(v));
    for (int s = 0; s < n; ++s) {
      std::span<const float> row(b.data() + s * 1000, 1000);
      last[s] = Argmax(row);
      // The same greedy token, unless the top two are closer than the tolerance allows.
      float second = -INFINITY;
      for (int i = 0; i < 1000; ++i) {
        if (i != last[s]) second = std::max(second, row[i]);
      }
      if (row[last[s]] - second > 2 * tol * largest) {
        EXPECT_EQ(Argmax(std::span<const float>(a.data() + s * 1000, 1000)), last[s]);
      }
    }
    a.resize(nseq * 1000);
    b.resize(nseq * 1000);
  }
  TandemModelInfo info{};
  ASSERT_EQ(api_->model_info(with, &info), 0);
  EXPECT_EQ(info.graphs_captured, 2);
  EXPECT_EQ(info.graph_capture_failures, 0);
  EXPECT_EQ(info.graph_replays, 4);  // the first step of each bucket runs eagerly
  ASSERT_EQ(api_->model_info(without, &info), 0);
  EXPECT_EQ(info.graphs_captured, 0);
  // Sampling on the device: greedy (temperature 0) rows equal the argmax of the logits.
  std::vector<TandemSampleRowParams> params(3, TandemSampleRowParams{0.f, 0, 1.f, 1, 0});
  std::vector<int> sampled(3, -1);
  for (int s = 0; s < 3; ++s) chunks[s] = {1, ctx + 6, 8, 0};
  ASSERT_EQ(api_->model_forward(with, chunks.data(), 3, last.data(), tables.data(), params.data(),
                                a.data(), sampled.data(), &rows),
            0)
      << api_->last_error();
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(sampled[s], Argmax(std::span<const float>(a.data() + s * 1000, 1000)));
  }
  api_->model_destroy(with);
  api_->model_destroy(without);
}

// On any machine: the CPU runner is Model::Forward over its own cache, bad devices and options
// are named, and --device=cuda without a GPU says so.
TEST(ModelRunnerTest, CpuRunnerIsTheModelAndErrorsNameTheFlag) {
  auto backend = MakeCpuBackend(2);
  auto model = Model::Load(testing::Stories260K(), backend.get());
  ASSERT_TRUE(model.ok()) << model.status();
  ModelRunnerOptions o;
  o.num_blocks = 8;
  auto cpu = MakeModelRunner("cpu", model->get(), o);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->device(), "cpu");
  EXPECT_EQ((*cpu)->num_blocks(), 8);
  EXPECT_EQ((*cpu)->block_size(), 16);
  auto cache = KvCache::Create((*model)->config(), 8, 16);
  ASSERT_TRUE(cache.ok());
  const std::vector<int> tokens = {1, 50, 60, 70}, table = {3, 5};
  std::vector<SequenceChunk> b = {{tokens, 0, table, true}};
  std::vector<float> want, got;
  ASSERT_TRUE((*model)->Forward(b, &*cache, &want).ok());
  int layers_seen = 0;
  ASSERT_TRUE((*cpu)->Forward(b, &got, [&](int) { ++layers_seen; }).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(layers_seen, (*model)->config().n_layers);
  auto packed = PackRunnerKv(**cpu, 0, table, 0, 4);
  ASSERT_TRUE(packed.ok());
  const KvChunkHeader h = MakeRunnerKvHeader(**cpu, 9, 0, 0, 4);
  EXPECT_EQ(h.width, static_cast<uint32_t>((*model)->config().kv_dim()));
  EXPECT_EQ(packed->size(), 2u * 4 * h.width * sizeof(float));
  EXPECT_TRUE(UnpackRunnerKv(**cpu, *packed, h, table).ok());

  EXPECT_FALSE((*cpu)->samples_on_device());
  std::vector<int> sampled;
  EXPECT_EQ((*cpu)->ForwardSample(b, {}, {}, &sampled).code(), absl::StatusCode::kUnimplemented);

  auto bad = MakeModelRunner("tpu", model->get(), o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tpu"), std::string::npos);
  ModelRunnerOptions zero;
  EXPECT_FALSE(zero.Validate().ok());
  if (!LoadCudaApi().ok()) {  // (with a GPU, the fixture's tests cover "cuda")
    auto cuda = MakeModelRunner("cuda", model->get(), o);
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(cuda.status().message().find("--device=cuda"), std::string::npos) << cuda.status();
  }
}

}  // namespace
}  // namespace tandem
