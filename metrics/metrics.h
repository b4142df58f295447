// Tandem's Prometheus metrics. One MetricsRegistry per process; each role the process plays
// (router, prefill, decode; all three for --role=all) builds its metric struct on it. Every
// series carries the labels `model`, `model_name` and `role`. Names mirror vLLM's (vllm:foo is
// tandem_foo), and a scrape carries vLLM's names too (VllmAliases); the disaggregated parts (queues
// on both sides, the KV transfer) have their own names. Latencies are histograms in seconds.
//
// The structs hold references into the registry: observe through them from any thread
// (prometheus-cpp metrics are thread-safe). Components take a nullable pointer to their struct,
// nullptr meaning no metrics.
#ifndef TANDEM_METRICS_METRICS_H_
#define TANDEM_METRICS_METRICS_H_

#include <array>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tandem {

// Bucket bounds, in seconds unless stated.
// Request-level latency (TTFT, end to end, queue, KV transfer): 1 ms to ~10 minutes.
const std::vector<double>& RequestLatencyBuckets();
// Token- and step-level latency (inter-token, TPOT, step time): 0.1 ms to 80 s, finer at the
// bottom because a small model on a CPU steps in well under a millisecond.
const std::vector<double>& TokenLatencyBuckets();
// Counts per step (batch tokens, batch size): powers of two, 1 to 16384.
const std::vector<double>& CountBuckets();
// A request's n (choices per prompt): vLLM's buckets, 1, 2, 5, 10, 20.
const std::vector<double>& ParamsNBuckets();
// A request's max_tokens: 1, 2, 5, 10, 20, 50, ... to 1,000,000 (vLLM's 1-2-5 series).
const std::vector<double>& MaxTokensBuckets();

// The `model` label value for a model path: the last path component, without the extension of
// a model file ("/m/stories260K/stories260K.bin" -> "stories260K", "/m/Llama-3.2-1B/" ->
// "Llama-3.2-1B").
std::string ModelLabel(std::string_view model_path);

// vLLM's name for a Tandem metric: every scrape carries `vllm` beside `tandem` (the same series,
// help and buckets), restricted to the series of `role` when it is set (request-level counts the
// router and the workers both keep), so that vLLM's dashboards, alerts and autoscaler queries
// resolve against a Tandem cluster unchanged.
struct VllmAlias {
  std::string tandem;
  std::string vllm;
  std::string role;  // empty: every role's series
};
const std::vector<VllmAlias>& VllmAliases();

// The registry of one process, and what a scrape collects: runs the collect hooks (which set
// gauges whose value is computed when read, e.g. worker health) and then the metrics.
class MetricsRegistry : public prometheus::Collectable {
 public:
  explicit MetricsRegistry(std::string model);

  prometheus::Registry& registry() { return *registry_; }
  const std::string& model() const { return model_; }
  // The labels every series of `role` carries.
  prometheus::Labels Labels(const std::string& role) const;

  // `hook` runs before every collection, e.g. to set gauges computed when read. Returns an id
  // for RemoveCollectHook, which the hook's owner calls before the hook becomes invalid.
  int AddCollectHook(std::function<void()> hook);
  void RemoveCollectHook(int id);

  std::vector<prometheus::MetricFamily> Collect() const override;
  // The text exposition format, what GET /metrics returns.
  std::string Serialize() const;

 private:
  std::string model_;
  std::shared_ptr<prometheus::Registry> registry_;
  mutable std::mutex hooks_mu_;  // held while hooks run
  std::map<int, std::function<void()>> hooks_;
  int next_hook_ = 1;
};

// tandem_cache_config_info{role, cache_dtype, block_size, num_blocks} = 1: a worker's KV cache
// as configured (vLLM publishes the same).
void SetCacheConfigInfo(MetricsRegistry& r, const std::string& role, std::string_view cache_dtype,
                        int block_size, int num_blocks);

// The router: one request is one Generate call.
struct RouterMetrics {
  explicit RouterMetrics(MetricsRegistry& r);

  // Generate calls by final gRPC status code name ("OK", "CANCELLED", ...).
  prometheus::Counter& requests(int grpc_code);
  // Successful requests by finish reason: "stop", "length", "context".
  prometheus::Counter& success(std::string_view finished_reason);
  // Health (1/0) of a registered worker; `worker_role` is "prefill" or "decode".
  prometheus::Gauge& worker_healthy(const std::string& worker, std::string_view worker_role);
  // A worker picked for a request (decode admission attempts, prefill calls).
  prometheus::Counter& routing_decisions(const std::string& worker, std::string_view worker_role);

  MetricsRegistry& registry;
  prometheus::Labels labels;  // model, role="router"
  prometheus::Family<prometheus::Counter>& requests_family;
  prometheus::Family<prometheus::Counter>& success_family;
  prometheus::Family<prometheus::Gauge>& worker_healthy_family;
  prometheus::Family<prometheus::Counter>& routing_family;
  std::array<prometheus::Counter*, 17> requests_by_code;  // grpc::StatusCode 0..16

  prometheus::Histogram& time_to_first_token;        // arrival to the first token sent
  prometheus::Histogram& inter_token_latency;        // one per token after the first
  prometheus::Histogram& time_per_output_token;      // per request: (e2e - ttft) / (n - 1)
  prometheus::Histogram& e2e_request_latency;        // arrival to the last token, successes
  prometheus::Histogram& queue_time;                 // arrival to admission on a decode worker
  prometheus::Counter& prompt_tokens;                // prompts of requests that got a first token
  prometheus::Counter& generation_tokens;            // tokens streamed to clients
  prometheus::Gauge& num_requests_running;           // past the first token, decoding
  prometheus::Gauge& num_requests_waiting;           // admission and prefill, no token yet
  prometheus::Counter& resumes;                      // attempts resumed after a worker/KV fault
  prometheus::Histogram& request_prompt_tokens;      // per successful request
  prometheus::Histogram& request_generation_tokens;  // per successful request
  // vLLM's request phases, per successful request: admission on a decode worker to the first
  // token (prefill), the first token to the last (decode), admission to the last (inference).
  prometheus::Histogram& request_prefill_time;
  prometheus::Histogram& request_decode_time;
  prometheus::Histogram& request_inference_time;
  // The client's parameters of successful requests: n per prompt (1 for a gRPC Generate call),
  // max_tokens per generated sequence.
  prometheus::Histogram& request_params_n;
  prometheus::Histogram& request_params_max_tokens;
};

// A prefill worker.
struct PrefillMetrics {
  explicit PrefillMetrics(MetricsRegistry& r);

  prometheus::Labels labels;                  // model, role="prefill"
  prometheus::Gauge& num_requests_waiting;    // prompts queued, no chunk computed yet
  prometheus::Gauge& num_requests_running;    // prompts being computed or shipped
  prometheus::Gauge& prompt_tokens_waiting;   // prompt tokens of queued or running prompts not
                                              // computed yet (the autoscaling signal)
  prometheus::Histogram& queue_time;          // enqueue to the first chunk scheduled
  prometheus::Histogram& batch_tokens;        // prompt tokens computed per step
  prometheus::Histogram& iteration_tokens;    // the same under vLLM's name
  prometheus::Histogram& step_time;           // seconds per forward step
  prometheus::Counter& prefix_cache_queries;  // prompt tokens looked up (as vLLM: tokens)
  prometheus::Counter& prefix_cache_hits;     // of those, tokens found in the cache
  prometheus::Counter& prompt_tokens;         // prompt tokens of successful prefills
  prometheus::Histogram& kv_transfer_time;    // first chunk sent to the last acknowledged
  prometheus::Counter& kv_transfer_bytes;     // KV payload bytes queued for sending
  prometheus::Counter& kv_transfer_failures;  // transfers whose acknowledgement was an error
};

// A decode worker.
struct DecodeMetrics {
  explicit DecodeMetrics(MetricsRegistry& r);

  prometheus::Labels labels;                // model, role="decode"
  prometheus::Gauge& num_requests_running;  // in the running batch
  prometheus::Gauge& num_requests_waiting;  // admitted, not yet running
  prometheus::Gauge& kv_leases_waiting;     // open leases: KV arriving or not yet started
  prometheus::Gauge& kv_cache_usage;        // fraction of KV blocks in use, 0..1
  prometheus::Histogram& batch_size;        // requests per decode step
  prometheus::Histogram& iteration_tokens;  // tokens computed per decode step (recomputes too)
  prometheus::Histogram& step_time;         // seconds per decode step
  prometheus::Counter& generation_tokens;   // tokens sampled by decode steps
  prometheus::Counter& kv_transfer_bytes;   // KV payload bytes accepted into leases
  prometheus::Counter& kv_leases_expired;   // leases whose KV never completed
  prometheus::Counter& kv_chunks_rejected;  // chunks refused: late writers, stale generations
  prometheus::Counter& preemptions;         // sequences preempted when the cache filled
  // Speculative decoding, under vLLM's names: drafts (a sequence's proposals in one verify
  // step), proposals scored, proposals kept, and per draft the proposals kept (0..K).
  prometheus::Counter& spec_num_drafts;
  prometheus::Counter& spec_draft_tokens;
  prometheus::Counter& spec_accepted_tokens;
  prometheus::Histogram& spec_acceptance_length;
};

}  // namespace tandem

#endif  // TANDEM_METRICS_METRICS_H_
