#include "metrics/metrics.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <utility>

#include "prometheus/text_serializer.h"

namespace tandem {
namespace {

// gRPC status code names, indexed by code (grpc::StatusCode; not included here to keep gRPC
// out of the metrics library).
constexpr std::array<const char*, 17> kGrpcCodeNames = {
    "OK",        "CANCELLED",      "UNKNOWN",           "INVALID_ARGUMENT",   "DEADLINE_EXCEEDED",
    "NOT_FOUND", "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
    "ABORTED",   "OUT_OF_RANGE",   "UNIMPLEMENTED",     "INTERNAL",           "UNAVAILABLE",
    "DATA_LOSS", "UNAUTHENTICATED"};
constexpr std::array<const char*, 3> kFinishReasons = {"stop", "length", "context"};

// One help text per family. Several roles share a family (the `role` label tells them apart),
// so the text says what each role counts.
const std::map<std::string, std::string>& HelpTexts() {
  static const auto* kHelp = new std::map<std::string, std::string>{
      {"tandem_requests_total", "Router: Generate requests by final gRPC status code."},
      {"tandem_request_success_total", "Router: successfully finished requests by reason."},
      {"tandem_worker_healthy",
       "Router: 1 while a registered worker is healthy (heartbeating, serving, not ejected)."},
      {"tandem_routing_decisions_total", "Router: workers picked for requests."},
      {"tandem_resumes_total",
       "Router: request attempts resumed after a worker or KV transfer failure."},
      {"tandem_time_to_first_token_seconds",
       "Router: request arrival to its first token sent to the client."},
      {"tandem_inter_token_latency_seconds",
       "Router: time between consecutive tokens sent to a client."},
      {"tandem_request_time_per_output_token_seconds",
       "Router: per request of two or more tokens, (e2e - ttft) / (tokens - 1)."},
      {"tandem_e2e_request_latency_seconds",
       "Router: arrival to the last token, successful requests."},
      {"tandem_request_queue_time_seconds",
       "Router: arrival to admission on a decode worker. Prefill: enqueued to first chunk."},
      {"tandem_prompt_tokens_total",
       "Prompt tokens of requests whose prefill succeeded (router and prefill)."},
      {"tandem_generation_tokens_total",
       "Router: tokens streamed to clients. Decode: tokens sampled by decode steps."},
      {"tandem_num_requests_running",
       "Router: decoding, past the first token. Prefill: being computed or shipped. Decode: in "
       "the running batch."},
      {"tandem_num_requests_waiting",
       "Router: in admission or prefill, no token sent yet. Prefill: queued, no chunk computed. "
       "Decode: admitted, not yet running."},
      {"tandem_prefill_batch_tokens", "Prefill: prompt tokens computed per step."},
      {"tandem_prefill_tokens_waiting",
       "Prefill: prompt tokens of queued and running prompts not computed yet (prefix-cache "
       "hits excluded)."},
      {"tandem_iteration_tokens_total",
       "Tokens computed per forward step (vLLM's iteration_tokens_total). Prefill: prompt "
       "tokens. Decode: sampled and recomputed tokens."},
      {"tandem_request_prompt_tokens", "Router: prompt tokens per successful request."},
      {"tandem_request_generation_tokens", "Router: tokens generated per successful request."},
      {"tandem_request_prefill_time_seconds",
       "Router: per successful request, admission on a decode worker to the first token (vLLM's "
       "request_prefill_time_seconds: prefill, KV transfer and the first token)."},
      {"tandem_request_decode_time_seconds",
       "Router: per successful request, the first token to the last."},
      {"tandem_request_inference_time_seconds",
       "Router: per successful request, admission on a decode worker to the last token "
       "(prefill and decode time)."},
      {"tandem_request_params_n",
       "Router: the n (choices) of successful requests, per prompt; 1 for a gRPC Generate call."},
      {"tandem_request_params_max_tokens",
       "Router: the max_tokens of successfully generated sequences."},
      {"tandem_prefill_step_seconds", "Prefill: duration of one forward step."},
      {"tandem_prefix_cache_queries_total",
       "Prefill: prompt tokens looked up in the prefix cache."},
      {"tandem_prefix_cache_hits_total", "Prefill: prompt tokens found in the prefix cache."},
      {"tandem_kv_transfer_seconds",
       "Prefill: per request, first KV chunk sent to the last one acknowledged."},
      {"tandem_kv_transfer_bytes_total",
       "KV payload bytes. Prefill: queued for sending. Decode: accepted into leases."},
      {"tandem_kv_transfer_failures_total",
       "Prefill: KV transfers that failed (refused, corrupt, connection lost, deadline)."},
      {"tandem_kv_leases_waiting",
       "Decode: open KV leases (prompt KV arriving, or the request not started yet)."},
      {"tandem_kv_cache_usage_perc", "Decode: fraction of the KV blocks in use, 0..1."},
      {"tandem_decode_batch_size", "Decode: requests per decode step."},
      {"tandem_decode_step_seconds", "Decode: duration of one decode step."},
      {"tandem_kv_leases_expired_total", "Decode: leases freed because their KV did not complete."},
      {"tandem_kv_chunks_rejected_total",
       "Decode: KV chunks refused (unknown or expired lease, stale generation, bad range)."},
      {"tandem_cache_config_info",
       "A worker's KV cache as configured: the labels cache_dtype, block_size and num_blocks; "
       "the value is 1."},
      {"tandem_spec_decode_num_drafts_total",
       "Decode: speculative drafts scored (one per sequence and verify step)."},
      {"tandem_spec_decode_num_draft_tokens_total",
       "Decode: tokens proposed by speculative decoding and scored by the model."},
      {"tandem_spec_decode_num_accepted_tokens_total",
       "Decode: proposed tokens kept (each equal to the token the model drew there)."},
      {"tandem_spec_decode_acceptance_length",
       "Decode: per sequence and verify step, the proposals kept (0 to --spec-tokens); the step "
       "emits one token more."},
      {"tandem_num_preemptions_total",
       "Decode: running sequences preempted when the KV cache filled (their blocks freed, their "
       "KV recomputed on the worker later)."},
  };
  return *kHelp;
}

const std::string& Help(const std::string& name) { return HelpTexts().at(name); }

prometheus::Labels With(prometheus::Labels labels, const std::string& key,
                        const std::string& value) {
  labels[key] = value;
  return labels;
}

// The registry merges a family registered again under the same name, so the roles of one
// process (--role=all) share each family.
prometheus::Family<prometheus::Counter>& CounterFamily(MetricsRegistry& r,
                                                       const std::string& name) {
  return prometheus::BuildCounter().Name(name).Help(Help(name)).Register(r.registry());
}

prometheus::Family<prometheus::Gauge>& GaugeFamily(MetricsRegistry& r, const std::string& name) {
  return prometheus::BuildGauge().Name(name).Help(Help(name)).Register(r.registry());
}

prometheus::Counter& NewCounter(MetricsRegistry& r, const prometheus::Labels& labels,
                                const std::string& name) {
  return CounterFamily(r, name).Add(labels);
}

prometheus::Gauge& NewGauge(MetricsRegistry& r, const prometheus::Labels& labels,
                            const std::string& name) {
  return GaugeFamily(r, name).Add(labels);
}

prometheus::Histogram& NewHistogram(MetricsRegistry& r, const prometheus::Labels& labels,
                                    const std::string& name, const std::vector<double>& buckets) {
  return prometheus::BuildHistogram()
      .Name(name)
      .Help(Help(name))
      .Register(r.registry())
      .Add(labels, buckets);
}

}  // namespace

void SetCacheConfigInfo(MetricsRegistry& r, const std::string& role, std::string_view cache_dtype,
                        int block_size, int num_blocks) {
  prometheus::Labels labels = r.Labels(role);
  labels["cache_dtype"] = std::string(cache_dtype);
  labels["block_size"] = std::to_string(block_size);
  labels["num_blocks"] = std::to_string(num_blocks);
  NewGauge(r, labels, "tandem_cache_config_info").Set(1);
}

const std::vector<double>& RequestLatencyBuckets() {
  static const auto* kBuckets = new std::vector<double>{
      0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.25,  0.5,   0.75,
      1.0,   2.5,    5.0,   7.5,  10.0,  20.0, 40.0,  80.0, 160.0, 320.0, 640.0};
  return *kBuckets;
}

const std::vector<double>& TokenLatencyBuckets() {
  static const auto* kBuckets = new std::vector<double>{
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,  0.15,
      0.2,    0.3,     0.4,    0.5,   0.75,   1.0,   2.5,  5.0,   10.0, 20.0,  40.0, 80.0};
  return *kBuckets;
}

// Proposals kept per verify step: every count up to 8, then doublings to --spec-tokens' 64.
const std::vector<double>& AcceptanceLengthBuckets() {
  static const auto* kBuckets = new std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64};
  return *kBuckets;
}

const std::vector<double>& ParamsNBuckets() {
  static const auto* kBuckets = new std::vector<double>{1, 2, 5, 10, 20};
  return *kBuckets;
}

const std::vector<double>& MaxTokensBuckets() {
  static const auto* kBuckets = [] {
    auto* b = new std::vector<double>;
    for (double v = 1; v <= 1e6; v *= 10) {
      for (double m : {1.0, 2.0, 5.0}) {
        if (v * m <= 1e6) b->push_back(v * m);
      }
    }
    return b;
  }();
  return *kBuckets;
}

const std::vector<double>& CountBuckets() {
  static const auto* kBuckets = [] {
    auto* b = new std::vector<double>;
    for (double v = 1; v <= 16384; v *= 2) b->push_back(v);
    return b;
  }();
  return *kBuckets;
}

std::string ModelLabel(std::string_view model_path) {
  while (model_path.size() > 1 && model_path.back() == '/') model_path.remove_suffix(1);
  const size_t slash = model_path.rfind('/');
  std::string_view base =
      slash == std::string_view::npos ? model_path : model_path.substr(slash + 1);
  // A model file loses its extension; a folder keeps its name whole ("Llama-3.2-1B").
  for (std::string_view ext : {".bin", ".safetensors", ".gguf"}) {
    if (base.size() > ext.size() && base.substr(base.size() - ext.size()) == ext) {
      base.remove_suffix(ext.size());
      break;
    }
  }
  return std::string(base);
}

namespace {

// When this process started, in seconds since the epoch (read once, at the first registry).
double ProcessStartSeconds() {
  static const double start =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  return start;
}

}  // namespace

MetricsRegistry::MetricsRegistry(std::string model)
    : model_(std::move(model)), registry_(std::make_shared<prometheus::Registry>()) {
  // The Prometheus client libraries' own name: a worker restarted (by `tandem up`, Kubernetes
  // or anything else) is a change of it, which changes(process_start_time_seconds[1h]) counts.
  prometheus::BuildGauge()
      .Name("process_start_time_seconds")
      .Help("Start time of the process since unix epoch in seconds.")
      .Register(*registry_)
      .Add({})
      .Set(ProcessStartSeconds());
}

prometheus::Labels MetricsRegistry::Labels(const std::string& role) const {
  // model_name: vLLM's label for the same value, so its dashboards' queries select these series.
  return {{"model", model_}, {"model_name", model_}, {"role", role}};
}

int MetricsRegistry::AddCollectHook(std::function<void()> hook) {
  std::lock_guard<std::mutex> lock(hooks_mu_);
  const int id = next_hook_++;
  hooks_[id] = std::move(hook);
  return id;
}

void MetricsRegistry::RemoveCollectHook(int id) {
  std::lock_guard<std::mutex> lock(hooks_mu_);
  hooks_.erase(id);
}

const std::vector<VllmAlias>& VllmAliases() {
  // Request-level counts come from the router alone (the workers count their own parts of the
  // same requests under the same Tandem names): a vLLM dashboard's sum over the cluster then
  // counts each request once.
  static const auto* kAliases = new std::vector<VllmAlias>{
      {"tandem_num_requests_running", "vllm:num_requests_running", "router"},
      {"tandem_num_requests_waiting", "vllm:num_requests_waiting", "router"},
      {"tandem_prompt_tokens_total", "vllm:prompt_tokens_total", "router"},
      {"tandem_generation_tokens_total", "vllm:generation_tokens_total", "router"},
      {"tandem_request_success_total", "vllm:request_success_total", ""},
      {"tandem_time_to_first_token_seconds", "vllm:time_to_first_token_seconds", ""},
      {"tandem_inter_token_latency_seconds", "vllm:inter_token_latency_seconds", ""},
      {"tandem_inter_token_latency_seconds", "vllm:time_per_output_token_seconds", ""},
      {"tandem_request_time_per_output_token_seconds", "vllm:request_time_per_output_token_seconds",
       ""},
      {"tandem_e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds", ""},
      {"tandem_request_queue_time_seconds", "vllm:request_queue_time_seconds", "router"},
      {"tandem_request_inference_time_seconds", "vllm:request_inference_time_seconds", ""},
      {"tandem_request_prefill_time_seconds", "vllm:request_prefill_time_seconds", ""},
      {"tandem_request_decode_time_seconds", "vllm:request_decode_time_seconds", ""},
      {"tandem_request_prompt_tokens", "vllm:request_prompt_tokens", ""},
      {"tandem_request_generation_tokens", "vllm:request_generation_tokens", ""},
      {"tandem_request_params_n", "vllm:request_params_n", ""},
      {"tandem_request_params_max_tokens", "vllm:request_params_max_tokens", ""},
      {"tandem_iteration_tokens_total", "vllm:iteration_tokens_total", ""},
      {"tandem_kv_cache_usage_perc", "vllm:kv_cache_usage_perc", ""},
      {"tandem_kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", ""},
      {"tandem_num_preemptions_total", "vllm:num_preemptions_total", ""},
      {"tandem_prefix_cache_queries_total", "vllm:prefix_cache_queries_total", ""},
      {"tandem_prefix_cache_hits_total", "vllm:prefix_cache_hits_total", ""},
      {"tandem_cache_config_info", "vllm:cache_config_info", ""},
      {"tandem_spec_decode_num_drafts_total", "vllm:spec_decode_num_drafts_total", ""},
      {"tandem_spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_draft_tokens_total", ""},
      {"tandem_spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_accepted_tokens_total",
       ""},
  };
  return *kAliases;
}

std::vector<prometheus::MetricFamily> MetricsRegistry::Collect() const {
  {
    std::lock_guard<std::mutex> lock(hooks_mu_);
    for (const auto& [id, hook] : hooks_) hook();
  }
  std::vector<prometheus::MetricFamily> families = registry_->Collect();
  const size_t own = families.size();
  for (size_t i = 0; i < own; ++i) {
    for (const VllmAlias& alias : VllmAliases()) {
      if (families[i].name != alias.tandem) continue;
      prometheus::MetricFamily copy = families[i];
      copy.name = alias.vllm;
      if (!alias.role.empty()) {
        std::erase_if(copy.metric, [&](const prometheus::ClientMetric& m) {
          return std::none_of(m.label.begin(), m.label.end(), [&](const auto& l) {
            return l.name == "role" && l.value == alias.role;
          });
        });
      }
      if (!copy.metric.empty()) families.push_back(std::move(copy));
    }
  }
  return families;
}

std::string MetricsRegistry::Serialize() const {
  return prometheus::TextSerializer().Serialize(Collect());
}

RouterMetrics::RouterMetrics(MetricsRegistry& r)
    : registry(r),
      labels(r.Labels("router")),
      requests_family(CounterFamily(r, "tandem_requests_total")),
      success_family(CounterFamily(r, "tandem_request_success_total")),
      worker_healthy_family(GaugeFamily(r, "tandem_worker_healthy")),
      routing_family(CounterFamily(r, "tandem_routing_decisions_total")),
      time_to_first_token(
          NewHistogram(r, labels, "tandem_time_to_first_token_seconds", RequestLatencyBuckets())),
      inter_token_latency(
          NewHistogram(r, labels, "tandem_inter_token_latency_seconds", TokenLatencyBuckets())),
      time_per_output_token(NewHistogram(r, labels, "tandem_request_time_per_output_token_seconds",
                                         TokenLatencyBuckets())),
      e2e_request_latency(
          NewHistogram(r, labels, "tandem_e2e_request_latency_seconds", RequestLatencyBuckets())),
      queue_time(
          NewHistogram(r, labels, "tandem_request_queue_time_seconds", RequestLatencyBuckets())),
      prompt_tokens(NewCounter(r, labels, "tandem_prompt_tokens_total")),
      generation_tokens(NewCounter(r, labels, "tandem_generation_tokens_total")),
      num_requests_running(NewGauge(r, labels, "tandem_num_requests_running")),
      num_requests_waiting(NewGauge(r, labels, "tandem_num_requests_waiting")),
      resumes(NewCounter(r, labels, "tandem_resumes_total")),
      request_prompt_tokens(
          NewHistogram(r, labels, "tandem_request_prompt_tokens", CountBuckets())),
      request_generation_tokens(
          NewHistogram(r, labels, "tandem_request_generation_tokens", CountBuckets())),
      request_prefill_time(
          NewHistogram(r, labels, "tandem_request_prefill_time_seconds", RequestLatencyBuckets())),
      request_decode_time(
          NewHistogram(r, labels, "tandem_request_decode_time_seconds", RequestLatencyBuckets())),
      request_inference_time(NewHistogram(r, labels, "tandem_request_inference_time_seconds",
                                          RequestLatencyBuckets())),
      request_params_n(NewHistogram(r, labels, "tandem_request_params_n", ParamsNBuckets())),
      request_params_max_tokens(
          NewHistogram(r, labels, "tandem_request_params_max_tokens", MaxTokensBuckets())) {
  for (size_t code = 0; code < kGrpcCodeNames.size(); ++code) {
    requests_by_code[code] = &requests_family.Add(With(labels, "status", kGrpcCodeNames[code]));
  }
  // Every finish reason exists from the start, so rate() sees the first one.
  for (const char* reason : kFinishReasons) success(reason);
}

prometheus::Counter& RouterMetrics::requests(int grpc_code) {
  constexpr int kUnknown = 2;
  if (grpc_code < 0 || grpc_code >= static_cast<int>(requests_by_code.size())) grpc_code = kUnknown;
  return *requests_by_code[grpc_code];
}

prometheus::Counter& RouterMetrics::success(std::string_view finished_reason) {
  return success_family.Add(With(labels, "finished_reason", std::string(finished_reason)));
}

prometheus::Gauge& RouterMetrics::worker_healthy(const std::string& worker,
                                                 std::string_view worker_role) {
  return worker_healthy_family.Add(
      With(With(labels, "worker", worker), "worker_role", std::string(worker_role)));
}

prometheus::Counter& RouterMetrics::routing_decisions(const std::string& worker,
                                                      std::string_view worker_role) {
  return routing_family.Add(
      With(With(labels, "worker", worker), "worker_role", std::string(worker_role)));
}

PrefillMetrics::PrefillMetrics(MetricsRegistry& r)
    : labels(r.Labels("prefill")),
      num_requests_waiting(NewGauge(r, labels, "tandem_num_requests_waiting")),
      num_requests_running(NewGauge(r, labels, "tandem_num_requests_running")),
      prompt_tokens_waiting(NewGauge(r, labels, "tandem_prefill_tokens_waiting")),
      queue_time(
          NewHistogram(r, labels, "tandem_request_queue_time_seconds", RequestLatencyBuckets())),
      batch_tokens(NewHistogram(r, labels, "tandem_prefill_batch_tokens", CountBuckets())),
      iteration_tokens(NewHistogram(r, labels, "tandem_iteration_tokens_total", CountBuckets())),
      step_time(NewHistogram(r, labels, "tandem_prefill_step_seconds", TokenLatencyBuckets())),
      prefix_cache_queries(NewCounter(r, labels, "tandem_prefix_cache_queries_total")),
      prefix_cache_hits(NewCounter(r, labels, "tandem_prefix_cache_hits_total")),
      prompt_tokens(NewCounter(r, labels, "tandem_prompt_tokens_total")),
      kv_transfer_time(
          NewHistogram(r, labels, "tandem_kv_transfer_seconds", RequestLatencyBuckets())),
      kv_transfer_bytes(NewCounter(r, labels, "tandem_kv_transfer_bytes_total")),
      kv_transfer_failures(NewCounter(r, labels, "tandem_kv_transfer_failures_total")) {}

DecodeMetrics::DecodeMetrics(MetricsRegistry& r)
    : labels(r.Labels("decode")),
      num_requests_running(NewGauge(r, labels, "tandem_num_requests_running")),
      num_requests_waiting(NewGauge(r, labels, "tandem_num_requests_waiting")),
      kv_leases_waiting(NewGauge(r, labels, "tandem_kv_leases_waiting")),
      kv_cache_usage(NewGauge(r, labels, "tandem_kv_cache_usage_perc")),
      batch_size(NewHistogram(r, labels, "tandem_decode_batch_size", CountBuckets())),
      iteration_tokens(NewHistogram(r, labels, "tandem_iteration_tokens_total", CountBuckets())),
      step_time(NewHistogram(r, labels, "tandem_decode_step_seconds", TokenLatencyBuckets())),
      generation_tokens(NewCounter(r, labels, "tandem_generation_tokens_total")),
      kv_transfer_bytes(NewCounter(r, labels, "tandem_kv_transfer_bytes_total")),
      kv_leases_expired(NewCounter(r, labels, "tandem_kv_leases_expired_total")),
      kv_chunks_rejected(NewCounter(r, labels, "tandem_kv_chunks_rejected_total")),
      preemptions(NewCounter(r, labels, "tandem_num_preemptions_total")),
      spec_num_drafts(NewCounter(r, labels, "tandem_spec_decode_num_drafts_total")),
      spec_draft_tokens(NewCounter(r, labels, "tandem_spec_decode_num_draft_tokens_total")),
      spec_accepted_tokens(NewCounter(r, labels, "tandem_spec_decode_num_accepted_tokens_total")),
      spec_acceptance_length(NewHistogram(r, labels, "tandem_spec_decode_acceptance_length",
                                          AcceptanceLengthBuckets())) {}

}  // namespace tandem
