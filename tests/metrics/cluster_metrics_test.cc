// The /metrics endpoints of real processes (router, prefill, decode, and --role=all) on
// loopback: after a known set of requests, every counter agrees with what the clients saw and
// with the other processes' counters, the gauges are back to zero, and a dead worker's health
// gauge drops to 0.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <thread>

#include "tests/metrics/metrics_text.h"
#include "tests/serving/cluster.h"

namespace tandem {
namespace {

using testing::Cluster;
using testing::MetricSample;
using testing::MetricValue;
using testing::Scrape;

// What one client saw of a Generate call.
struct Seen {
  grpc::Status status;
  int tokens = 0;
  int prompt_tokens = 0;
  std::string finish;
};

Seen Call(v1::Generation::Stub* stub, const v1::GenerateRequest& req, int deadline_ms = 60000) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  auto reader = stub->Generate(&ctx, req);
  Seen seen;
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    seen.tokens += resp.token_ids_size();
    if (resp.finish_reason() == v1::FINISH_REASON_STOP) seen.finish = "stop";
    if (resp.finish_reason() == v1::FINISH_REASON_LENGTH) seen.finish = "length";
    if (resp.finish_reason() == v1::FINISH_REASON_CONTEXT) seen.finish = "context";
    if (resp.has_usage()) seen.prompt_tokens = resp.usage().prompt_tokens();
  }
  seen.status = reader->Finish();
  return seen;
}

v1::GenerateRequest Request(const std::string& text, int max_tokens, bool ignore_eos) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.set_max_tokens(max_tokens);
  r.set_ignore_eos(ignore_eos);
  r.mutable_sampling()->set_temperature(0);
  return r;
}

TEST(ClusterMetricsTest, CountersAgreeWithClientsAndAcrossProcesses) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  ASSERT_EQ(c.metrics().size(), 3u);
  for (const auto& m : c.metrics()) ASSERT_FALSE(m.empty());

  std::vector<v1::GenerateRequest> reqs = {
      Request("Once upon a time", 12, true),
      Request("The little dog", 9, true),
      Request("Lily and Tom went to the park", 14, true),
      Request("Once upon a time", 200, false),  // may end at EOS
      Request("A big red ball", 1, true),       // ends with the prefill's token
      Request("The cat", 0, true),              // INVALID_ARGUMENT: max_tokens
  };
  std::vector<Seen> seen(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] { seen[i] = Call(c.generation(), reqs[i]); });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(c.AllBlocksFree());

  int ok = 0, tokens = 0, prompt_tokens = 0, multi_token = 0;
  std::map<std::string, int> reasons;
  for (size_t i = 0; i + 1 < seen.size(); ++i) {
    ASSERT_TRUE(seen[i].status.ok()) << i << ": " << seen[i].status.error_message();
    ++ok;
    tokens += seen[i].tokens;
    prompt_tokens += seen[i].prompt_tokens;
    multi_token += seen[i].tokens > 1;
    ++reasons[seen[i].finish];
  }
  ASSERT_EQ(seen.back().status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(reasons["length"] + reasons["stop"], ok);

  const std::vector<MetricSample> router = Scrape(c.metrics()[0]);
  const std::vector<MetricSample> prefill = Scrape(c.metrics()[1]);
  const std::vector<MetricSample> decode = Scrape(c.metrics()[2]);
  ASSERT_FALSE(router.empty());
  ASSERT_FALSE(prefill.empty());
  ASSERT_FALSE(decode.empty());
  auto r = [&](const std::string& name, std::map<std::string, std::string> match = {}) {
    match["role"] = "router";
    match["model"] = "stories260K";
    return MetricValue(router, name, match);
  };
  // Router: requests by status, tokens, finish reasons, histograms.
  EXPECT_EQ(r("tandem_requests_total", {{"status", "OK"}}), ok);
  EXPECT_EQ(r("tandem_requests_total", {{"status", "INVALID_ARGUMENT"}}), 1);
  EXPECT_EQ(r("tandem_requests_total"), static_cast<double>(reqs.size()));
  EXPECT_EQ(r("tandem_generation_tokens_total"), tokens);
  EXPECT_EQ(r("tandem_prompt_tokens_total"), prompt_tokens);
  for (const char* reason : {"stop", "length", "context"}) {
    EXPECT_EQ(r("tandem_request_success_total", {{"finished_reason", reason}}), reasons[reason])
        << reason;
  }
  EXPECT_EQ(r("tandem_time_to_first_token_seconds_count"), ok);
  EXPECT_EQ(r("tandem_time_to_first_token_seconds_bucket", {{"le", "+Inf"}}), ok);
  EXPECT_EQ(r("tandem_e2e_request_latency_seconds_count"), ok);
  EXPECT_EQ(r("tandem_request_queue_time_seconds_count"), ok);
  EXPECT_EQ(r("tandem_request_time_per_output_token_seconds_count"), multi_token);
  EXPECT_EQ(r("tandem_inter_token_latency_seconds_count"), tokens - ok);
  EXPECT_GT(r("tandem_time_to_first_token_seconds_sum"), 0);
  EXPECT_LE(r("tandem_time_to_first_token_seconds_sum"),
            r("tandem_e2e_request_latency_seconds_sum"));
  // vLLM's request phases and parameters, once per successful request: prefill (admission to
  // the first token) and decode (on to the last) add up to the inference time.
  int max_tokens = 0;
  for (size_t i = 0; i + 1 < reqs.size(); ++i) max_tokens += reqs[i].max_tokens();
  for (const char* h : {"tandem_request_prefill_time_seconds", "tandem_request_decode_time_seconds",
                        "tandem_request_inference_time_seconds", "tandem_request_params_n",
                        "tandem_request_params_max_tokens"}) {
    EXPECT_EQ(r(std::string(h) + "_count"), ok) << h;
    EXPECT_EQ(r(std::string(h) + "_bucket", {{"le", "+Inf"}}), ok) << h;
  }
  EXPECT_EQ(r("tandem_request_params_n_sum"), ok);  // gRPC Generate: n = 1
  EXPECT_EQ(r("tandem_request_params_n_bucket", {{"le", "1"}}), ok);
  EXPECT_EQ(r("tandem_request_params_max_tokens_sum"), max_tokens);
  EXPECT_EQ(r("tandem_request_params_max_tokens_bucket", {{"le", "10"}}), 2);  // 9 and 1
  EXPECT_EQ(r("tandem_request_params_max_tokens_bucket", {{"le", "200"}}), ok);
  const double prefill_s = r("tandem_request_prefill_time_seconds_sum");
  const double decode_s = r("tandem_request_decode_time_seconds_sum");
  const double inference_s = r("tandem_request_inference_time_seconds_sum");
  EXPECT_GT(prefill_s, 0);
  EXPECT_GT(decode_s, 0);
  EXPECT_NEAR(prefill_s + decode_s, inference_s, 1e-6);
  EXPECT_LE(prefill_s, r("tandem_time_to_first_token_seconds_sum"));
  EXPECT_LE(inference_s, r("tandem_e2e_request_latency_seconds_sum"));
  EXPECT_NEAR(decode_s + r("tandem_time_to_first_token_seconds_sum"),
              r("tandem_e2e_request_latency_seconds_sum"), 1e-6);
  EXPECT_EQ(r("tandem_num_requests_running"), 0);
  EXPECT_EQ(r("tandem_num_requests_waiting"), 0);
  EXPECT_EQ(r("tandem_resumes_total"), 0);
  EXPECT_EQ(r("tandem_worker_healthy", {{"worker_role", "prefill"}}), 1);
  EXPECT_EQ(r("tandem_worker_healthy", {{"worker_role", "decode"}}), 1);
  EXPECT_EQ(r("tandem_routing_decisions_total", {{"worker_role", "prefill"}}), ok);
  EXPECT_EQ(r("tandem_routing_decisions_total", {{"worker_role", "decode"}}), ok);

  // Prefill: the same prompts, one transfer each, and the bytes the decode worker accepted.
  auto p = [&](const std::string& name) {
    return MetricValue(prefill, name, {{"role", "prefill"}, {"model", "stories260K"}});
  };
  auto d = [&](const std::string& name) {
    return MetricValue(decode, name, {{"role", "decode"}, {"model", "stories260K"}});
  };
  EXPECT_EQ(p("tandem_prompt_tokens_total"), prompt_tokens);
  EXPECT_EQ(p("tandem_prefix_cache_queries_total"), prompt_tokens);
  EXPECT_EQ(p("tandem_request_queue_time_seconds_count"), ok);
  EXPECT_EQ(p("tandem_kv_transfer_seconds_count"), ok);
  EXPECT_EQ(p("tandem_kv_transfer_failures_total"), 0);
  const double kv_bytes = p("tandem_kv_transfer_bytes_total");
  EXPECT_GT(kv_bytes, 0);
  EXPECT_EQ(d("tandem_kv_transfer_bytes_total"), kv_bytes);
  // Every prompt token costs the same bytes (K and V of every layer).
  EXPECT_EQ(std::fmod(kv_bytes, prompt_tokens), 0);
  EXPECT_EQ(p("tandem_num_requests_running"), 0);
  EXPECT_EQ(p("tandem_num_requests_waiting"), 0);
  EXPECT_GE(p("tandem_prefill_batch_tokens_count"), 1);

  // Decode: every token but the first of each request was sampled there.
  EXPECT_EQ(d("tandem_generation_tokens_total"), tokens - ok);
  EXPECT_EQ(d("tandem_decode_batch_size_sum"), tokens - ok);
  EXPECT_EQ(d("tandem_decode_step_seconds_count"), d("tandem_decode_batch_size_count"));
  EXPECT_EQ(d("tandem_num_requests_running"), 0);
  EXPECT_EQ(d("tandem_num_requests_waiting"), 0);
  EXPECT_EQ(d("tandem_kv_leases_waiting"), 0);
  EXPECT_EQ(d("tandem_kv_cache_usage_perc"), 0);
  EXPECT_EQ(d("tandem_kv_leases_expired_total"), 0);
  EXPECT_EQ(d("tandem_num_preemptions_total"), 0);

  // A client cancel and a deadline are counted by their status; the gauges come back to 0.
  {
    grpc::ClientContext ctx;
    auto reader = c.generation()->Generate(&ctx, Request("Once upon a time", 400, true));
    v1::GenerateResponse resp;
    for (int i = 0; i < 3 && reader->Read(&resp);) ++i;
    ctx.TryCancel();
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // 10 ms: a fast host streams all 400 tokens of stories260K in under 30.
  EXPECT_EQ(Call(c.generation(), Request("Once upon a time", 400, true), 10).status.error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  ASSERT_TRUE(c.AllBlocksFree());
  const std::vector<MetricSample> after = Scrape(c.metrics()[0]);
  EXPECT_EQ(MetricValue(after, "tandem_requests_total", {{"status", "CANCELLED"}}), 1);
  EXPECT_EQ(MetricValue(after, "tandem_requests_total", {{"status", "DEADLINE_EXCEEDED"}}), 1);
  EXPECT_EQ(MetricValue(after, "tandem_requests_total", {{"status", "OK"}}), ok);
  EXPECT_EQ(MetricValue(after, "tandem_num_requests_running", {{"role", "router"}}), 0);
  EXPECT_EQ(MetricValue(after, "tandem_num_requests_waiting", {{"role", "router"}}), 0);
  EXPECT_GE(MetricValue(after, "tandem_generation_tokens_total"), tokens + 3);
}

// Speculative decoding under vLLM's names: every draft is one sequence's proposals in one
// verify step (the acceptance-length histogram observes each), at most --spec-tokens of them,
// and no more proposals kept than scored.
TEST(ClusterMetricsTest, SpeculativeDecodingCountsDraftsUnderVllmNames) {
  constexpr int kSpecTokens = 4;
  Cluster c(1, 1, {"--speculative", "ngram", "--spec-tokens", std::to_string(kSpecTokens)});
  ASSERT_TRUE(c.ready());
  // Repetitive stories: the n-gram proposer finds continuations in them.
  for (const char* prompt : {"Once upon a time", "The little dog saw the little dog"}) {
    const Seen seen = Call(c.generation(), Request(prompt, 60, true));
    ASSERT_TRUE(seen.status.ok()) << seen.status.error_message();
  }
  ASSERT_TRUE(c.AllBlocksFree());
  const std::vector<MetricSample> decode = Scrape(c.metrics()[2]);
  auto d = [&](const std::string& name) {
    return MetricValue(decode, name, {{"role", "decode"}, {"model", "stories260K"}});
  };
  const double drafts = d("tandem_spec_decode_num_drafts_total");
  const double draft_tokens = d("tandem_spec_decode_num_draft_tokens_total");
  const double accepted = d("tandem_spec_decode_num_accepted_tokens_total");
  EXPECT_GT(drafts, 0);
  EXPECT_GE(draft_tokens, drafts);
  EXPECT_LE(draft_tokens, kSpecTokens * drafts);
  EXPECT_GT(accepted, 0);
  EXPECT_LE(accepted, draft_tokens);
  EXPECT_EQ(d("tandem_spec_decode_acceptance_length_count"), drafts);
  EXPECT_EQ(d("tandem_spec_decode_acceptance_length_sum"), accepted);
}

TEST(ClusterMetricsTest, DeadWorkerHealthGaugeDropsToZero) {
  Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  ASSERT_EQ(c.pids().size(), 3u);
  auto healthy = [&](const char* role) {
    return MetricValue(Scrape(c.metrics()[0]), "tandem_worker_healthy", {{"worker_role", role}});
  };
  EXPECT_EQ(healthy("decode"), 1);
  ::kill(c.pids()[2], SIGKILL);  // the decode worker
  // Its heartbeats stop; the router's timeout here is 1 s (3 x 100 ms, at least 1 s).
  double decode = 1;
  for (int i = 0; i < 100 && decode != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    decode = healthy("decode");
  }
  EXPECT_EQ(decode, 0);
  EXPECT_EQ(healthy("prefill"), 1);
}

TEST(ClusterMetricsTest, RoleAllServesEveryRoleOnOneEndpoint) {
  Cluster c(0, 0);
  ASSERT_TRUE(c.ready());
  ASSERT_EQ(c.metrics().size(), 1u);
  Seen seen = Call(c.generation(), Request("Once upon a time", 8, true));
  ASSERT_TRUE(seen.status.ok()) << seen.status.error_message();
  ASSERT_TRUE(c.AllBlocksFree());
  const std::vector<MetricSample> all = Scrape(c.metrics()[0]);
  EXPECT_EQ(MetricValue(all, "tandem_generation_tokens_total", {{"role", "router"}}), 8);
  EXPECT_EQ(MetricValue(all, "tandem_generation_tokens_total", {{"role", "decode"}}), 7);
  EXPECT_EQ(MetricValue(all, "tandem_prompt_tokens_total", {{"role", "prefill"}}),
            seen.prompt_tokens);
  // The in-process transport still counts both ends of the transfer.
  EXPECT_GT(MetricValue(all, "tandem_kv_transfer_bytes_total", {{"role", "prefill"}}), 0);
  EXPECT_EQ(MetricValue(all, "tandem_kv_transfer_bytes_total", {{"role", "prefill"}}),
            MetricValue(all, "tandem_kv_transfer_bytes_total", {{"role", "decode"}}));
}

}  // namespace
}  // namespace tandem
