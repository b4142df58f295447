#include "server/server_config.h"

#include <cstdio>
#include <iostream>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/fault_injection.h"
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/scheduling/scheduler.h"
#include "engine/speculative/proposer.h"
#include "kernels/dtype.h"

namespace tandem {
namespace {

constexpr char kDescription[] =
    "tandem-server: a Tandem process. --role=router serves the public APIs and routes requests;\n"
    "prefill and decode workers register with it; --role=all is all three in one process with\n"
    "the in-process KV transport.";

constexpr char kFooter[] = R"(
Prints "listening HOST:PORT" (gRPC: the router's public API, a worker's internal port),
"internal HOST:PORT" (the internal port) and "metrics HOST:PORT" (http://HOST:PORT/metrics) on
stdout when serving, and a router then "http HOST:PORT" (the OpenAI-compatible API);
SIGINT/SIGTERM drain and stop it (exit 0): NOT_SERVING at once, in-flight work finishes within
--drain-timeout-ms.)";

// The largest HTTP request: 16 MiB of body and 64 KiB of headers (HttpServerOptions).
constexpr int64_t kMinHttpBufferedBytes = (int64_t{16} << 20) + (int64_t{64} << 10);

absl::Status InRange(const char* flag, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    return absl::InvalidArgumentError(absl::StrFormat("%s must be in [%d, %d]", flag, lo, hi));
  return absl::OkStatus();
}

absl::Status AtLeast(const char* flag, int64_t v, int64_t lo) {
  if (v < lo) return absl::InvalidArgumentError(absl::StrFormat("%s must be >= %d", flag, lo));
  return absl::OkStatus();
}

// The first error of `checks`, in order.
absl::Status FirstError(std::initializer_list<absl::Status> checks) {
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

void AddCommonFlags(CLI::App& app, CommonConfig* c) {
  const std::string g = "Every role";
  app.add_option("--role", c->role, "router | prefill | decode | all")->group(g);
  app.add_option("--model", c->model,
                 "A Hugging Face model directory, a GGUF file or a llama2.c checkpoint (required)")
      ->group(g);
  app.add_option("--tokenizer", c->tokenizer, "Tokenizer path (default: the one beside the model)")
      ->group(g);
  app.add_option("--host", c->host, "Address every port listens on")->group(g);
  app.add_option("--port", c->port,
                 "Router: the public gRPC API; workers: their internal port (0: pick a free one)")
      ->group(g);
  app.add_option("--device", c->device,
                 "auto | cpu | cuda: where workers run the forward pass (auto: the GPU when one "
                 "is usable)")
      ->group(g);
  app.add_option("--cluster-secret-file", c->cluster_secret_file,
                 "The cluster's shared secret: every internal call and KV connection proves it; "
                 "required unless mutual TLS with role certificates is on (--role=all makes its "
                 "own)")
      ->group(g);
  app.add_option("--metrics-port", c->metrics_port, "Prometheus /metrics on --host (0: pick)")
      ->group(g);
  app.add_option("--tls-cert", c->tls_cert, "PEM certificate: serve TLS")->group(g);
  app.add_option("--tls-key", c->tls_key, "PEM key of --tls-cert")->group(g);
  app.add_option("--tls-ca", c->tls_ca, "PEM CA: mutual TLS on every port and channel")->group(g);
  app.add_option("--max-message-bytes", c->max_message_bytes, "Largest request received")->group(g);
  app.add_option("--advertise-host", c->advertise_host,
                 "The address others reach this process at (default $TANDEM_ADVERTISE_HOST, "
                 "else --host; required for workers when --host is a wildcard)")
      ->group(g);
  app.add_option("--keepalive-ms", c->keepalive_ms, "gRPC keepalive ping interval")->group(g);
  app.add_option(
         "--max-threads", c->max_threads,
         "Threads for synchronous gRPC calls (0: 2048; the router's Generate streams hold none)")
      ->group(g);
  app.add_option("--drain-timeout-ms", c->drain_timeout_ms,
                 "SIGTERM: how long in-flight work may take to finish")
      ->group(g);
  app.add_option("--cpu-nice", c->cpu_nice,
                 "0-19: the CPU niceness of every thread of this process. A prefill worker that "
                 "shares cores with a decode worker runs niced so that the decode steps keep "
                 "their pace (tandem up gives its prefill workers 10)")
      ->group(g);
  app.add_flag("--cpu-idle", c->cpu_idle,
               "Every thread of this process at the SCHED_IDLE policy: it runs only on CPU time "
               "nothing else on the host wants (tandem up --prefill-idle gives it to its prefill "
               "workers, for the steadiest decode pace at the cost of time to first token)")
      ->group(g);
}

void AddRouterFlags(CLI::App& app, RouterConfig* c) {
  const std::string g = "Router";
  app.add_option("--internal-port", c->internal_port,
                 "The registry workers register with (give them --router HOST:PORT); never "
                 "expose it to clients")
      ->group(g);
  app.add_option("--heartbeat-ms", c->heartbeat_ms, "Worker heartbeat interval")->group(g);
  app.add_option("--forget-after-ms", c->forget_after_ms,
                 "Silent workers leave the registry after this long")
      ->group(g);
  app.add_option("--api-keys-file", c->api_keys_file, "Bearer API keys, one per line")->group(g);
  app.add_option("--max-inflight", c->max_inflight, "Requests running at once")->group(g);
  app.add_option("--max-queued", c->max_queued, "Requests waiting for a slot")->group(g);
  app.add_option("--queue-timeout-ms", c->queue_timeout_ms, "How long a request may wait")
      ->group(g);
  app.add_option("--max-resumes", c->max_resumes,
                 "Times a request resumes on another worker after one fails")
      ->group(g);
  app.add_option("--prefill-timeout-ms", c->prefill_timeout_ms,
                 "A started prefill whose worker makes no progress this long is resumed elsewhere")
      ->group(g);
  app.add_option("--ejection-ms", c->ejection_ms, "Outlier ejection back-off (doubling)")->group(g);
  app.add_option("--http-port", c->http_port, "OpenAI-compatible HTTP API on --host (0: pick)")
      ->group(g);
  app.add_option("--http-threads", c->http_threads,
                 "HTTP threads that parse and tokenize requests (a stream holds none)")
      ->group(g);
  app.add_option("--event-threads", c->event_threads,
                 "Router threads running requests' steps between their waits")
      ->group(g);
  app.add_option("--http-timeout-ms", c->http_timeout_ms, "HTTP request deadline (0: none)")
      ->group(g);
  app.add_option("--http-max-buffered-bytes", c->http_max_buffered_bytes,
                 "Bytes of HTTP requests held in memory at once, over every connection (past "
                 "it, 503 for the connection holding the most)")
      ->group(g);
  app.add_option("--http-max-building-bytes", c->http_max_building_bytes,
                 "Bytes whole (non-streamed) responses may reach, reserved over every request "
                 "(past it, 503 naming stream)")
      ->group(g);
  app.add_option("--http-max-connections", c->http_max_connections,
                 "Open HTTP connections (past it, an idle one makes room, else 503 with "
                 "Retry-After)")
      ->group(g);
  app.add_option("--http-max-connections-per-client", c->http_max_connections_per_client,
                 "Open HTTP connections per client address (past it, 429 with Retry-After); "
                 "clients behind one ingress share its address")
      ->group(g);
  app.add_option("--http-response-buffer-bytes", c->http_response_buffer_bytes,
                 "Unwritten response bytes per HTTP connection before a stream waits for its "
                 "client to read")
      ->group(g);
  app.add_option("--http-min-write-rate", c->http_min_write_rate,
                 "Bytes/s a client must read while its response buffer is full, or its request "
                 "is cancelled (0: only a 30 s stall)")
      ->group(g);
  app.add_option("--http-max-queued", c->http_max_queued,
                 "HTTP requests waiting for a serving thread; tenants (API keys, else client "
                 "addresses) take turns, and a full line refuses the tenant holding the most "
                 "(429 with Retry-After)")
      ->group(g);
  app.add_option("--trusted-proxies", c->trusted_proxies,
                 "Comma-separated addresses and CIDR ranges of proxies whose X-Forwarded-For "
                 "or Forwarded header names the HTTP client")
      ->group(g);
  app.add_option("--chat-template", c->chat_template,
                 "A Jinja chat template (default: the model's)")
      ->group(g);
  app.add_option("--served-model-name", c->served_model_name,
                 "The model id of the OpenAI API (default: the model's file or folder name)")
      ->group(g);
  app.add_flag("--http-metrics,!--no-http-metrics", c->http_metrics,
               "Also serve /metrics on the HTTP port, behind the API keys if any, as vLLM does "
               "(default; --no-http-metrics: only on the metrics port)")
      ->group(g);
}

void AddWorkerFlags(CLI::App& app, WorkerConfig* c) {
  const std::string g = "Workers (prefill and decode)";
  app.add_option("--router", c->router,
                 "The router's internal port HOST:PORT (HOST may resolve to several routers: "
                 "all are registered with, re-resolved every 10 s)")
      ->group(g);
  app.add_option("--worker-id", c->worker_id, "Name in the registry (default: ADDRESS-ROLE)")
      ->group(g);
  app.add_option("--block-size", c->block_size, "Tokens per KV block")->group(g);
  app.add_option("--num-blocks", c->num_blocks, "KV blocks (0: from --kv-bytes)")->group(g);
  app.add_option("--kv-bytes", c->kv_bytes,
                 "KV cache size (0: a decode worker takes --kv-memory-fraction of its memory "
                 "less the weights, a prefill worker 1 GiB or one context-length prompt's KV, "
                 "whichever is more)")
      ->group(g);
  app.add_option("--kv-memory-fraction", c->kv_memory_fraction,
                 "Of the memory a decode worker may use (its cgroup limit or the machine's; the "
                 "GPU's with --device=cuda), the share for weights and KV cache when --kv-bytes "
                 "and --num-blocks are 0")
      ->group(g);
  app.add_option("--dtype", c->dtype,
                 "The weights, converted at load when stored otherwise: f32, bf16, f16, q8_0, "
                 "q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (default: as stored; --device=cuda "
                 "needs f32 or bf16)")
      ->group(g);
  app.add_option("--kv-dtype", c->kv_dtype,
                 "auto | f32 | bf16 | f16 | fp8: the KV cache as stored and shipped (auto: bf16 "
                 "with --device=cuda where the model's head_dim has FlashInfer attention (64, "
                 "128), else f32); every worker of a cluster must use the same")
      ->group(g);
  app.add_option("--kv-transport", c->kv_transport,
                 "tcp | local | nccl (default: local under --role=all, else tcp); every worker "
                 "of a cluster must use the same")
      ->group(g);
  app.add_option("--nccl-device", c->nccl_device,
                 "nccl: the CUDA device KV is sent from / received into")
      ->group(g);
  app.add_option("--wedge-timeout-ms", c->wedge_timeout_ms,
                 "A step loop without progress this long turns health NOT_SERVING")
      ->group(g);
  app.add_option("--fault", c->fault, "Test builds: inject faults (engine/fault_injection.h)")
      ->group(g);
}

void AddPrefillFlags(CLI::App& app, PrefillConfig* c) {
  const std::string g = "Prefill";
  app.add_option("--token-budget", c->token_budget, "Tokens per prefill step")->group(g);
  app.add_option("--prefill-chunk", c->prefill_chunk, "Largest chunk of one prompt per step")
      ->group(g);
  app.add_flag("--no-prefix-cache", c->no_prefix_cache, "Never reuse a cached prompt prefix")
      ->group(g);
  app.add_option("--colocated-prefill-share", c->colocated_prefill_share,
                 "--role=all on the CPU: while streams decode, a prefill gets the cores for this "
                 "many times a decode step between two of them (so a stream's inter-token time "
                 "stays within about 1 + this many decode steps); 0: no sharing, 0-16")
      ->group(g);
}

void AddDecodeFlags(CLI::App& app, DecodeConfig* c) {
  const std::string g = "Decode";
  app.add_option("--kv-listen", c->kv_listen,
                 "tcp: HOST:PORT the KV receiver listens on (default: --host:0)")
      ->group(g);
  app.add_option("--max-running", c->max_running, "Sequences decoded at once")->group(g);
  app.add_option("--lease-timeout-ms", c->lease_timeout_ms,
                 "A KV lease whose decode never starts is freed after this long")
      ->group(g);
  app.add_option("--kv-admission", c->kv_admission,
                 "on-demand: blocks as tokens arrive, the newest sequences preempted and "
                 "recomputed when the cache is full; reserve: blocks for prompt + max_tokens at "
                 "admission, never preempted, fewer sequences")
      ->group(g);
  app.add_option("--kv-watermark", c->kv_watermark,
                 "on-demand: the fraction of blocks admission leaves free")
      ->group(g);
  app.add_option("--speculative", c->speculative,
                 "Speculative decoding: off; ngram (proposals by prompt lookup); draft (a small "
                 "model of the same tokenizer, --draft-model, decodes them greedily on the "
                 "worker's device). "
                 "The output is the same as without; requests may opt out")
      ->group(g);
  app.add_option("--spec-tokens", c->spec_tokens, "Speculative decoding: proposals per step, 1-64")
      ->group(g);
  app.add_option("--draft-model", c->draft_model,
                 "--speculative=draft: the draft model (a path as --model takes)")
      ->group(g);
}

}  // namespace

absl::Status CommonConfig::Validate() const {
  if (role != "router" && role != "prefill" && role != "decode" && role != "all") {
    return absl::InvalidArgumentError("--role must be router, prefill, decode or all");
  }
  if (model.empty()) return absl::InvalidArgumentError("--model is required");
  if (host.empty()) return absl::InvalidArgumentError("--host must not be empty");
  if (max_message_bytes < 1024 || max_message_bytes > INT32_MAX) {
    return absl::InvalidArgumentError("--max-message-bytes must be in [1024, 2^31)");
  }
  return FirstError(
      {InRange("--port", port, 0, 65535), InRange("--metrics-port", metrics_port, 0, 65535),
       AtLeast("--keepalive-ms", keepalive_ms, 1000), AtLeast("--max-threads", max_threads, 0),
       AtLeast("--drain-timeout-ms", drain_timeout_ms, 0), InRange("--cpu-nice", cpu_nice, 0, 19)});
}

absl::Status RouterConfig::Validate() const {
  if (absl::Status s = FirstError(
          {InRange("--internal-port", internal_port, 0, 65535),
           InRange("--http-port", http_port, 0, 65535),
           InRange("--http-threads", http_threads, 1, 1 << 14),
           InRange("--event-threads", event_threads, 1, 256),
           AtLeast("--max-inflight", max_inflight, 1), AtLeast("--max-queued", max_queued, 0),
           AtLeast("--queue-timeout-ms", queue_timeout_ms, 0),
           AtLeast("--max-resumes", max_resumes, 0),
           AtLeast("--prefill-timeout-ms", prefill_timeout_ms, 1),
           AtLeast("--ejection-ms", ejection_ms, 0),
           AtLeast("--http-timeout-ms", http_timeout_ms, 0),
           InRange("--http-max-buffered-bytes", http_max_buffered_bytes, kMinHttpBufferedBytes,
                   int64_t{1} << 40),
           InRange("--http-max-connections", http_max_connections, 1, 1 << 20),
           InRange("--http-max-building-bytes", http_max_building_bytes, 1 << 20, int64_t{1} << 40),
           InRange("--http-max-connections-per-client", http_max_connections_per_client, 1,
                   1 << 20),
           InRange("--http-response-buffer-bytes", http_response_buffer_bytes, 4096,
                   int64_t{1} << 30),
           InRange("--http-min-write-rate", http_min_write_rate, 0, int64_t{1} << 30),
           InRange("--http-max-queued", http_max_queued, 1, 1 << 22)});
      !s.ok()) {
    return s;
  }
  // Workers silent for 3 heartbeats (at least 1 s) are unhealthy; forgetting comes after that.
  const int64_t heartbeat_timeout_ms = std::max<int64_t>(3 * heartbeat_ms, 1000);
  if (forget_after_ms < heartbeat_timeout_ms) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--forget-after-ms must be >= the heartbeat timeout (%d ms)", heartbeat_timeout_ms));
  }
  return absl::OkStatus();
}

absl::Status WorkerConfig::Validate() const {
  if (absl::Status s = FirstError({InRange("--nccl-device", nccl_device, 0, 1024),
                                   AtLeast("--wedge-timeout-ms", wedge_timeout_ms, 100)});
      !s.ok()) {
    return s;
  }
  if (!dtype.empty()) {
    if (auto dt = ParseWeightDType(dtype); !dt.ok()) return dt.status();
  }
  if (auto kv = ParseKvDtype(kv_dtype); !kv.ok()) return kv.status();
  if (!(kv_memory_fraction > 0 && kv_memory_fraction <= 1)) {
    return absl::InvalidArgumentError("--kv-memory-fraction must be in (0, 1]");
  }
  if (kv_bytes < 0 || num_blocks < 0) {
    return absl::InvalidArgumentError("--kv-bytes and --num-blocks must be >= 0");
  }
  if (!kv_transport.empty() && kv_transport != "tcp" && kv_transport != "local" &&
      kv_transport != "nccl") {
    return absl::InvalidArgumentError("--kv-transport must be tcp, local or nccl");
  }
  if (auto faults = FaultSpec::Parse(fault); !faults.ok()) return faults.status();
  return absl::OkStatus();
}

absl::Status DecodeConfig::Validate() const {
  if (auto a = ParseKvAdmission(kv_admission); !a.ok()) return a.status();
  if (kv_watermark < 0 || kv_watermark >= 1) {
    return absl::InvalidArgumentError("--kv-watermark must be in [0, 1)");
  }
  auto method = ParseSpeculativeMethod(speculative);
  if (!method.ok()) return method.status();
  if (absl::Status s = ValidateSpecTokens(spec_tokens); !s.ok()) return s;
  if ((*method == SpeculativeMethod::kDraft) != !draft_model.empty()) {
    return absl::InvalidArgumentError(
        "--draft-model: given exactly when --speculative=draft (a model of the same tokenizer)");
  }
  return absl::OkStatus();
}

std::string ServerConfig::kv_transport() const {
  if (!worker.kv_transport.empty()) return worker.kv_transport;
  return common.role == "all" ? "local" : "tcp";  // the colocated mode moves KV in memory
}

absl::Status ServerConfig::Validate() const {
  if (absl::Status s = common.Validate(); !s.ok()) return s;
  if (is_router()) {
    if (absl::Status s = router.Validate(); !s.ok()) return s;
  }
  if (is_prefill() || is_decode()) {
    if (absl::Status s = worker.Validate(); !s.ok()) return s;
  }
  if (is_decode()) {
    if (absl::Status s = decode.Validate(); !s.ok()) return s;
  }
  if (is_worker_process()) {
    if (worker.router.empty()) {
      return absl::InvalidArgumentError("--router HOST:PORT is required for a worker");
    }
    if (router.internal_port != 0) {
      return absl::InvalidArgumentError(
          "--internal-port is for a router: a worker's --port is its internal port");
    }
  }
  if (!(prefill.colocated_prefill_share >= 0 && prefill.colocated_prefill_share <= 16)) {
    return absl::InvalidArgumentError("--colocated-prefill-share must be in [0, 16]");
  }
  if (kv_transport() == "nccl" && common.role == "all") {
    return absl::InvalidArgumentError(
        "--kv-transport=nccl needs separate --role=prefill and --role=decode workers, each on "
        "its own GPU (NCCL cannot pair two ranks on one device); --role=all uses local");
  }
  return absl::OkStatus();
}

ServerCommandLine ParseServerFlags(int argc, char** argv, const char* fixed_role) {
  ServerCommandLine out;
  ServerConfig& c = out.config;
  CLI::App app(kDescription, fixed_role ? absl::StrCat("tandem-", fixed_role) : "tandem-server");
  app.footer(kFooter);
  app.option_defaults()->always_capture_default()->multi_option_policy(
      CLI::MultiOptionPolicy::TakeLast);
  app.set_version_flag("--version", std::string("tandem-server ") + TANDEM_VERSION);
  AddCommonFlags(app, &c.common);
  AddRouterFlags(app, &c.router);
  AddWorkerFlags(app, &c.worker);
  AddPrefillFlags(app, &c.prefill);
  AddDecodeFlags(app, &c.decode);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::cout << app.help();
    out.exit = true;
    return out;
  } catch (const CLI::CallForAllHelp&) {
    std::cout << app.help();
    out.exit = true;
    return out;
  } catch (const CLI::CallForVersion& e) {
    std::cout << e.what() << "\n";
    out.exit = true;
    return out;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), e.what());
    out.exit = true;
    out.exit_code = 2;
    return out;
  }
  if (fixed_role != nullptr) c.common.role = fixed_role;
  if (absl::Status s = c.Validate(); !s.ok()) {
    std::fprintf(stderr, "%s: %s\n", app.get_name().c_str(), std::string(s.message()).c_str());
    out.exit = true;
    out.exit_code = 2;
  }
  return out;
}

}  // namespace tandem
