// The metrics of the prefill and decode engines, in process: a known sequence of requests moves
// every counter and histogram by the amount it must, the gauges follow a request's states and
// come back to zero, and lease expiry and transfer failures are counted. Values are read back
// from the registry's text exposition, exactly what /metrics serves.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <vector>

#include "decode_node/decode_engine.h"
#include "metrics/metrics.h"
#include "prefill_node/prefill_engine.h"
#include "tests/metrics/metrics_text.h"
#include "tests/serving/engine_pair.h"
#include "tests/test_util.h"
#include "text/llama2c_tokenizer.h"

namespace tandem {
namespace {

using testing::MetricValue;

class EngineMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = std::move(*Model::Load(testing::Stories260K(), backend_.get()));
    tok_ = std::move(*Llama2cTokenizer::Load(testing::Tok512(), 512));
    registry_ = std::make_shared<MetricsRegistry>("stories260K");
    prefill_metrics_ = std::make_unique<PrefillMetrics>(*registry_);
    decode_metrics_ = std::make_unique<DecodeMetrics>(*registry_);
  }

  // Engines over the local transport; `sender_options` may inject faults.
  void StartEngines(KvSenderOptions sender_options = {},
                    absl::Duration lease_timeout = absl::Seconds(60)) {
    sender_ = std::move(*MakeKvSender("local", sender_options));
    PrefillEngineOptions po;
    po.block_size = 16;
    po.num_blocks = 256;
    auto p = PrefillEngine::Create(model_.get(), sender_.get(), po, prefill_metrics_.get());
    ASSERT_TRUE(p.ok()) << p.status();
    prefill_ = std::move(*p);
    DecodeEngineOptions dopt;
    dopt.block_size = 16;
    dopt.num_blocks = kDecodeBlocks;
    dopt.transport = "local";
    dopt.listen = "engine-metrics-test";
    dopt.lease_timeout = lease_timeout;
    auto d = DecodeEngine::Create(model_.get(), dopt, decode_metrics_.get());
    ASSERT_TRUE(d.ok()) << d.status();
    decode_ = std::move(*d);
  }

  void TearDown() override {
    if (decode_) {
      EXPECT_TRUE(decode_->Idle());
    }
    if (prefill_) {
      EXPECT_TRUE(prefill_->Idle());
    }
    decode_.reset();
    prefill_.reset();
    sender_.reset();
  }

  // Prefill then decode; the generated ids (the first from the prefill), or the first error.
  absl::StatusOr<std::vector<int>> Run(const GenerationRequest& r, int* cached = nullptr) {
    return testing::RunPrefillThenDecode(prefill_.get(), decode_.get(), r, cached);
  }

  double Value(const std::string& name, const std::string& role,
               std::map<std::string, std::string> match = {}) {
    match["role"] = role;
    match["model"] = "stories260K";
    return MetricValue(testing::ParseMetricsText(registry_->Serialize()), name, match);
  }

  static constexpr int kDecodeBlocks = 128;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Llama2cTokenizer> tok_;
  std::shared_ptr<MetricsRegistry> registry_;
  std::unique_ptr<PrefillMetrics> prefill_metrics_;
  std::unique_ptr<DecodeMetrics> decode_metrics_;
  std::unique_ptr<KvSender> sender_;
  std::unique_ptr<PrefillEngine> prefill_;
  std::unique_ptr<DecodeEngine> decode_;
};

TEST_F(EngineMetricsTest, KnownSequenceMovesEveryCounterByItsAmount) {
  StartEngines();
  // Before any request every series exists and reads zero.
  EXPECT_EQ(Value("tandem_prompt_tokens_total", "prefill"), 0);
  EXPECT_EQ(Value("tandem_kv_cache_usage_perc", "decode"), 0);
  EXPECT_EQ(Value("tandem_prefill_tokens_waiting", "prefill"), 0);
  EXPECT_EQ(Value("tandem_decode_step_seconds_count", "decode"), 0);

  const std::string long_text =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
      "park with her big red ball.";
  std::vector<GenerationRequest> reqs(3);
  reqs[0].prompt = tok_->Encode(long_text, true);
  reqs[1].prompt = tok_->Encode("The cat sat", true);
  reqs[2].prompt = reqs[0].prompt;        // a prefix-cache hit
  ASSERT_GT(reqs[0].prompt.size(), 33u);  // at least two full blocks to reuse
  for (auto& r : reqs) {
    r.max_tokens = 12;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
  }
  int prompt_tokens = 0;
  int computed_tokens = 0;
  int decoded_tokens = 0;
  int cached_tokens = 0;
  for (const auto& r : reqs) {
    int cached = 0;
    auto out = Run(r, &cached);
    ASSERT_TRUE(out.ok()) << out.status();
    ASSERT_EQ(out->size(), 12u);
    prompt_tokens += static_cast<int>(r.prompt.size());
    computed_tokens += static_cast<int>(r.prompt.size()) - cached;
    decoded_tokens += static_cast<int>(out->size()) - 1;  // the first comes from the prefill
    cached_tokens += cached;
  }
  // The third prompt reused every full block but the one holding its last token.
  EXPECT_EQ(cached_tokens, (static_cast<int>(reqs[2].prompt.size()) - 1) / 16 * 16);

  // Prefill.
  EXPECT_EQ(Value("tandem_prompt_tokens_total", "prefill"), prompt_tokens);
  EXPECT_EQ(Value("tandem_prefix_cache_queries_total", "prefill"), prompt_tokens);
  EXPECT_EQ(Value("tandem_prefix_cache_hits_total", "prefill"), cached_tokens);
  EXPECT_EQ(Value("tandem_prefill_batch_tokens_sum", "prefill"), computed_tokens);
  const double prefill_steps = Value("tandem_prefill_batch_tokens_count", "prefill");
  EXPECT_GE(prefill_steps, 3);  // one request at a time: at least one step each
  EXPECT_EQ(Value("tandem_prefill_step_seconds_count", "prefill"), prefill_steps);
  EXPECT_GT(Value("tandem_prefill_step_seconds_sum", "prefill"), 0);
  EXPECT_EQ(Value("tandem_request_queue_time_seconds_count", "prefill"), 3);
  EXPECT_EQ(Value("tandem_kv_transfer_seconds_count", "prefill"), 3);
  EXPECT_EQ(Value("tandem_kv_transfer_failures_total", "prefill"), 0);
  EXPECT_EQ(Value("tandem_num_requests_waiting", "prefill"), 0);
  EXPECT_EQ(Value("tandem_num_requests_running", "prefill"), 0);
  EXPECT_EQ(Value("tandem_prefill_tokens_waiting", "prefill"), 0);  // every token computed
  EXPECT_EQ(Value("tandem_iteration_tokens_total_sum", "prefill"), computed_tokens);
  // Every prompt token's K and V of every layer crossed, cached ones included (the decode
  // worker has none of them); the CPU cache holds fp32.
  const ModelConfig& c = model_->config();
  const double kv_bytes = double{2} * c.n_layers * c.kv_dim() * sizeof(float) * prompt_tokens;
  EXPECT_EQ(Value("tandem_kv_transfer_bytes_total", "prefill"), kv_bytes);
  EXPECT_EQ(Value("tandem_kv_transfer_bytes_total", "decode"), kv_bytes);

  // Decode: one request at a time, so every step has a batch of one.
  EXPECT_EQ(Value("tandem_generation_tokens_total", "decode"), decoded_tokens);
  EXPECT_EQ(Value("tandem_decode_batch_size_sum", "decode"), decoded_tokens);
  EXPECT_EQ(Value("tandem_decode_batch_size_count", "decode"), decode_->steps());
  EXPECT_EQ(Value("tandem_decode_batch_size_bucket", "decode", {{"le", "1"}}), decode_->steps());
  EXPECT_EQ(Value("tandem_decode_step_seconds_count", "decode"), decode_->steps());
  EXPECT_EQ(Value("tandem_num_requests_running", "decode"), 0);
  EXPECT_EQ(Value("tandem_num_requests_waiting", "decode"), 0);
  EXPECT_EQ(Value("tandem_kv_leases_waiting", "decode"), 0);
  EXPECT_EQ(Value("tandem_kv_cache_usage_perc", "decode"), 0);
  EXPECT_EQ(Value("tandem_kv_leases_expired_total", "decode"), 0);
  EXPECT_EQ(Value("tandem_num_preemptions_total", "decode"), 0);
}

TEST_F(EngineMetricsTest, GaugesFollowARequestThroughItsStates) {
  StartEngines();
  GenerationRequest r;
  r.prompt = tok_->Encode("Once upon a time", true);
  r.max_tokens = 400;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  auto adm = decode_->Admit(r);
  ASSERT_TRUE(adm.ok()) << adm.status();
  // Admitted: blocks for the prompt and the first token (the rest come as tokens do), the lease
  // waits for the KV.
  const int blocks = (static_cast<int>(r.prompt.size()) + 1 + 15) / 16;
  EXPECT_EQ(Value("tandem_num_requests_waiting", "decode"), 1);
  EXPECT_EQ(Value("tandem_num_requests_running", "decode"), 0);
  EXPECT_EQ(Value("tandem_kv_leases_waiting", "decode"), 1);
  EXPECT_DOUBLE_EQ(Value("tandem_kv_cache_usage_perc", "decode"),
                   static_cast<double>(blocks) / kDecodeBlocks);
  auto pre = prefill_->Prefill(adm->handle, r.prompt, r.sampling, adm->target,
                               absl::Now() + absl::Seconds(30));
  ASSERT_TRUE(pre.ok()) << pre.status();
  ASSERT_TRUE(decode_->Start(adm->handle, pre->first_token).ok());
  // Running: the lease is closed, the blocks stay with the request. 399 more steps remain,
  // far more than the time this read takes.
  EXPECT_EQ(Value("tandem_num_requests_waiting", "decode"), 0);
  EXPECT_EQ(Value("tandem_num_requests_running", "decode"), 1);
  EXPECT_EQ(Value("tandem_kv_leases_waiting", "decode"), 0);
  decode_->Cancel(adm->handle);
  for (int i = 0; i < 200 && !decode_->Idle(); ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(Value("tandem_num_requests_running", "decode"), 0);
  EXPECT_EQ(Value("tandem_kv_cache_usage_perc", "decode"), 0);
}

TEST_F(EngineMetricsTest, ExpiredLeaseIsCounted) {
  StartEngines({}, absl::Milliseconds(200));
  GenerationRequest r;
  r.prompt = {1, 403, 407};
  r.max_tokens = 5;
  auto adm = decode_->Admit(r);
  ASSERT_TRUE(adm.ok());
  // No prefill ever sends: the lease expires and the request fails.
  DecodeEngine::Output o = decode_->Next(adm->handle, absl::Seconds(5));
  EXPECT_EQ(o.error.code(), absl::StatusCode::kDeadlineExceeded) << o.error;
  EXPECT_EQ(Value("tandem_kv_leases_expired_total", "decode"), 1);
  EXPECT_EQ(Value("tandem_kv_leases_waiting", "decode"), 0);
  EXPECT_EQ(Value("tandem_num_requests_waiting", "decode"), 0);
  EXPECT_EQ(Value("tandem_kv_cache_usage_perc", "decode"), 0);
}

TEST_F(EngineMetricsTest, CorruptChunkIsATransferFailure) {
  KvSenderOptions faulty;
  faulty.corrupt_chunk_index = 0;
  StartEngines(faulty);
  GenerationRequest r;
  r.prompt = tok_->Encode("Once upon a time", true);
  r.max_tokens = 5;
  auto out = Run(r);
  EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << out.status();
  EXPECT_EQ(Value("tandem_kv_transfer_failures_total", "prefill"), 1);
  EXPECT_EQ(Value("tandem_kv_transfer_seconds_count", "prefill"), 0);
  EXPECT_EQ(Value("tandem_prompt_tokens_total", "prefill"), 0);
  EXPECT_EQ(Value("tandem_num_requests_running", "prefill"), 0);
  // The next request is fine (only chunk 0 was corrupted).
  EXPECT_TRUE(Run(r).ok());
  EXPECT_EQ(Value("tandem_kv_transfer_failures_total", "prefill"), 1);
  EXPECT_EQ(Value("tandem_prompt_tokens_total", "prefill"), r.prompt.size());
}

TEST(MetricsRegistryTest, RolesShareFamiliesAndEverySeriesHasModelAndRole) {
  auto registry = std::make_shared<MetricsRegistry>(ModelLabel("/models/stories260K.bin"));
  EXPECT_EQ(registry->model(), "stories260K");
  EXPECT_EQ(ModelLabel("/m/Llama-3.2-1B/"), "Llama-3.2-1B");
  RouterMetrics router(*registry);
  PrefillMetrics prefill(*registry);
  DecodeMetrics decode(*registry);
  router.generation_tokens.Increment(5);
  decode.generation_tokens.Increment(4);
  router.requests(0).Increment();
  router.requests(99).Increment();  // out of range: counted as UNKNOWN
  router.success("length").Increment();
  router.worker_healthy("w1", "decode").Set(1);
  int hook_runs = 0;
  const int hook = registry->AddCollectHook([&] { ++hook_runs; });
  const std::string text = registry->Serialize();
  EXPECT_EQ(hook_runs, 1);
  registry->RemoveCollectHook(hook);
  registry->Serialize();
  EXPECT_EQ(hook_runs, 1);

  const auto samples = testing::ParseMetricsText(text);
  // One family per name: each HELP/TYPE line appears once.
  EXPECT_EQ(text.find("# TYPE tandem_generation_tokens_total counter"),
            text.rfind("# TYPE tandem_generation_tokens_total counter"));
  EXPECT_EQ(MetricValue(samples, "tandem_generation_tokens_total", {{"role", "router"}}), 5);
  EXPECT_EQ(MetricValue(samples, "tandem_generation_tokens_total", {{"role", "decode"}}), 4);
  EXPECT_EQ(MetricValue(samples, "tandem_requests_total", {{"status", "OK"}}), 1);
  EXPECT_EQ(MetricValue(samples, "tandem_requests_total", {{"status", "UNKNOWN"}}), 1);
  EXPECT_EQ(MetricValue(samples, "tandem_requests_total", {{"status", "CANCELLED"}}), 0);
  EXPECT_EQ(MetricValue(samples, "tandem_request_success_total", {{"finished_reason", "stop"}}), 0);
  EXPECT_EQ(MetricValue(samples, "tandem_request_success_total", {{"finished_reason", "length"}}),
            1);
  EXPECT_EQ(
      MetricValue(samples, "tandem_worker_healthy", {{"worker", "w1"}, {"worker_role", "decode"}}),
      1);
  EXPECT_EQ(MetricValue(samples, "tandem_time_to_first_token_seconds_count"), 0);
  // The process's start time, under the client libraries' name and with no labels (a restart
  // is a change of it).
  const double start = MetricValue(samples, "process_start_time_seconds");
  EXPECT_GT(start, 1.7e9);
  EXPECT_LE(
      start,
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  for (const auto& s : samples) {
    if (s.name == "process_start_time_seconds") continue;
    EXPECT_EQ(s.labels.count("model"), 1u) << s.name;
    EXPECT_EQ(s.labels.count("model_name"), 1u) << s.name;
    EXPECT_EQ(s.labels.count("role"), 1u) << s.name;
    EXPECT_TRUE(s.name.rfind("tandem_", 0) == 0 || s.name.rfind("vllm:", 0) == 0) << s.name;
  }
  // vLLM's names beside Tandem's: request-level counts from the router only, the rest as they
  // are, histograms with their buckets.
  EXPECT_EQ(MetricValue(samples, "vllm:generation_tokens_total"), 5);
  EXPECT_EQ(MetricValue(samples, "vllm:generation_tokens_total", {{"role", "decode"}}),
            -1);  // none
  EXPECT_EQ(MetricValue(samples, "vllm:request_success_total", {{"finished_reason", "length"}}), 1);
  EXPECT_EQ(MetricValue(samples, "vllm:time_to_first_token_seconds_count"), 0);
  EXPECT_EQ(MetricValue(samples, "vllm:kv_cache_usage_perc"), 0);
  EXPECT_NE(text.find("vllm:time_to_first_token_seconds_bucket{"), std::string::npos);
  EXPECT_NE(text.find("# TYPE vllm:num_requests_waiting gauge"), std::string::npos);
  EXPECT_EQ(text.find("vllm:worker_healthy"), std::string::npos);  // no vLLM counterpart
  // Request latency buckets run from a millisecond to minutes.
  EXPECT_EQ(RequestLatencyBuckets().front(), 0.001);
  EXPECT_GE(RequestLatencyBuckets().back(), 300.0);
  EXPECT_TRUE(std::is_sorted(RequestLatencyBuckets().begin(), RequestLatencyBuckets().end()));
  EXPECT_TRUE(std::is_sorted(TokenLatencyBuckets().begin(), TokenLatencyBuckets().end()));
}

}  // namespace
}  // namespace tandem
