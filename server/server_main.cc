#include "server/server_main.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "decode_node/decode_engine.h"
#include "decode_node/decode_service.h"
#include "engine/fault_injection.h"
#include "engine/kv_cache.h"
#include "engine/load_tokenizer.h"
#include "engine/model.h"
#include "engine/output_constraint.h"
#include "http/http_server.h"
#include "kernels/backend_loader.h"
#include "kv_transfer/kv_auth.h"
#include "kv_transfer/nccl/nccl_transport.h"
#include "metrics/metrics.h"
#include "metrics/metrics_server.h"
#include "prefill_node/nccl_bootstrap_client.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_service.h"
#include "router/router.h"
#include "rpc/internal_auth.h"
#include "rpc/tls.h"
#include "security/cluster_secret.h"
#include "server/registration.h"
#include "tools/flags.h"

namespace tandem {
namespace {

constexpr char kUsage[] =
    R"(usage: tandem-server --role=router|prefill|decode|all --model PATH [flags]

common:   --model PATH  --tokenizer PATH  --host 127.0.0.1  --port 0  --device auto|cpu|cuda
          (router: --port is the public API; workers: their internal port; cuda runs the
          forward pass on the GPU, auto picks it when one is usable)
          --cluster-secret-file PATH (the cluster's shared secret: every internal call and KV
          connection proves it; required unless mutual TLS with role certificates is on;
          --role=all makes its own)
          --metrics-port 0 (Prometheus /metrics on --host; 0 = pick a free port)
          --tls-cert PEM --tls-key PEM (serve TLS)  --tls-ca PEM (and mutual TLS, every port
          and channel)  --max-message-bytes 16777216 (largest request received)
          --advertise-host HOST (the address others reach this process at; default
          $TANDEM_ADVERTISE_HOST, else --host; required for workers when --host is 0.0.0.0)
router:   --internal-port 0 (the registry workers register with: give workers --router
          HOST:INTERNAL_PORT; never expose it to clients)
          --heartbeat-ms 500  --forget-after-ms 30000 (silent workers leave the registry)
          --api-keys-file PATH  --max-inflight 1024  --max-queued 256
          --queue-timeout-ms 10000  --max-resumes 3  --prefill-timeout-ms 30000
          --ejection-ms 5000 (outlier ejection back-off, doubling)  --keepalive-ms 10000
          --http-port 0 (OpenAI-compatible HTTP API on --host; 0 = pick a free port)
          --http-threads 64  --http-timeout-ms 0 (0 = no deadline)  --chat-template PATH
          --served-model-name NAME (default: the model's file or folder name)
          --http-metrics (also serve /metrics on the HTTP port, behind the API keys if any)
workers:  --router HOST:PORT (the router's internal port; HOST may resolve to several routers:
          all are registered with, re-resolved every 10 s)  --worker-id ID  --block-size 16
          --num-blocks N (0 = from --kv-bytes)  --kv-bytes BYTES
          --dtype DTYPE (the weights, converted at load when stored otherwise: f32, bf16,
          f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k; default as stored. Quantized
          weights run natively on the CPU; --device=cuda needs f32 or bf16)
          --kv-dtype auto|f32|bf16|f16|fp8 (the KV cache as stored and shipped; auto: the
          model's compute dtype, f32; every worker of a cluster must use the same)
prefill:  --kv-transport tcp|local|nccl  --token-budget 2048  --prefill-chunk 512  --no-prefix-cache
decode:   --kv-transport tcp|local|nccl  --kv-listen HOST:PORT (tcp)  --max-running 256
          --lease-timeout-ms 60000
          --kv-admission on-demand|reserve (on-demand: blocks as tokens arrive, the newest
          sequences preempted and recomputed when the cache is full; reserve: blocks for
          prompt + max_tokens at admission, never preempted, fewer sequences)
          --kv-watermark 0.01 (on-demand: the fraction of blocks admission leaves free)
workers:  --nccl-device 0 (nccl: the CUDA device KV is sent from / received into; every worker
          of a cluster must use the same --kv-transport)
workers:  --wedge-timeout-ms 10000 (a step loop stuck this long turns health NOT_SERVING)
          --fault SPEC (test builds: inject faults, see engine/fault_injection.h)
all:      --drain-timeout-ms 30000 (SIGTERM: NOT_SERVING at once, in-flight work finishes)
all:      router, prefill and decode in one process with the in-process KV transport

Prints "listening HOST:PORT" (gRPC: the router's public API, a worker's internal port),
"internal HOST:PORT" (the internal port) and "metrics HOST:PORT" (http://HOST:PORT/metrics) on
stdout when serving, and a router then "http HOST:PORT" (the OpenAI-compatible API);
SIGINT/SIGTERM drain and stop it (exit 0).
)";

// The tokenizer --tokenizer names, or else the one found beside the model; its path goes to
// *path (left empty when none was named or found).
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadModelTokenizer(const std::string& flag,
                                                              const std::string& model_path,
                                                              const ModelConfig& config,
                                                              std::string* path) {
  *path = flag;
  if (path->empty()) {
    auto found = FindTokenizerFor(model_path, config.vocab_size);
    if (!found.ok()) return found.status();
    *path = *found;
  }
  return LoadTokenizer(*path, config.architecture == "llama2c" ? config.vocab_size : 0);
}

int Fail(const std::string& msg) {
  std::fprintf(stderr, "tandem-server: %s\n", msg.c_str());
  return 2;
}

}  // namespace

int ServerMain(int argc, char** argv, const char* fixed_role) {
  // Signals are taken synchronously by the main thread (sigwait), so block them before any
  // thread exists.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "--version") {
    std::printf("tandem-server %s\n", TANDEM_VERSION);
    return 0;
  }
  if (std::any_of(args.begin(), args.end(),
                  [](const std::string& a) { return a == "--help" || a == "-h"; })) {
    args = {"--help"};
  }
  if (!args.empty() && (args[0] == "--help" || args[0] == "help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  // A table (clang-format puts one entry per line once there are more than 25).
  // clang-format off
  auto f = Flags::Parse(
      args,
      {"role",         "model",        "tokenizer",        "host",         "port",
       "device",       "heartbeat-ms", "router",           "worker-id",    "block-size",
       "num-blocks",   "kv-bytes",     "kv-transport",     "token-budget", "prefill-chunk",
       "kv-listen",    "max-running",  "lease-timeout-ms", "metrics-port", "api-keys-file",
       "max-inflight", "max-queued",   "queue-timeout-ms", "max-resumes",  "prefill-timeout-ms",
       "drain-timeout-ms", "wedge-timeout-ms", "ejection-ms", "keepalive-ms", "max-threads",
       "fault", "tls-cert", "tls-key", "tls-ca", "max-message-bytes", "advertise-host",
       "forget-after-ms", "http-port", "http-threads", "http-timeout-ms", "chat-template",
       "served-model-name", "nccl-device", "internal-port", "cluster-secret-file", "kv-dtype",
       "kv-admission", "kv-watermark", "dtype"},
      {"no-prefix-cache", "http-metrics"});
  // clang-format on
  if (!f.ok()) return Fail(std::string(f.status().message()));
  const std::string role = fixed_role ? fixed_role : f->Get("role", "all");
  if (role != "router" && role != "prefill" && role != "decode" && role != "all") {
    return Fail("--role must be router, prefill, decode or all");
  }
  if (!f->Has("model")) return Fail("--model is required");
  const std::string model_path = f->Get("model");
  const std::string host = f->Get("host", "127.0.0.1");
  auto port = f->GetInt("port", 0);
  auto internal_port = f->GetInt("internal-port", 0);
  auto block_size = f->GetInt("block-size", 16);
  auto num_blocks = f->GetInt("num-blocks", 0);
  auto kv_bytes = f->GetInt("kv-bytes", int64_t{1} << 30);
  auto heartbeat = f->GetInt("heartbeat-ms", 500);
  auto budget = f->GetInt("token-budget", 2048);
  auto chunk = f->GetInt("prefill-chunk", 512);
  auto max_running = f->GetInt("max-running", 256);
  auto lease_ms = f->GetInt("lease-timeout-ms", 60000);
  auto metrics_port = f->GetInt("metrics-port", 0);
  auto max_inflight = f->GetInt("max-inflight", 1024);
  auto max_queued = f->GetInt("max-queued", 256);
  auto queue_timeout_ms = f->GetInt("queue-timeout-ms", 10000);
  auto max_resumes = f->GetInt("max-resumes", 3);
  auto prefill_timeout_ms = f->GetInt("prefill-timeout-ms", 30000);
  auto http_port = f->GetInt("http-port", 0);
  auto http_threads = f->GetInt("http-threads", 64);
  auto http_timeout_ms = f->GetInt("http-timeout-ms", 0);
  auto drain_ms = f->GetInt("drain-timeout-ms", 30000);
  auto wedge_ms = f->GetInt("wedge-timeout-ms", 10000);
  auto ejection_ms = f->GetInt("ejection-ms", 5000);
  auto keepalive_ms = f->GetInt("keepalive-ms", 10000);
  auto max_threads = f->GetInt("max-threads", 0);
  auto forget_ms = f->GetInt("forget-after-ms", 30000);
  for (const auto* v :
       {&port,         &block_size, &num_blocks,       &kv_bytes,        &heartbeat,
        &budget,       &chunk,      &max_running,      &lease_ms,        &metrics_port,
        &max_inflight, &max_queued, &queue_timeout_ms, &max_resumes,     &prefill_timeout_ms,
        &drain_ms,     &wedge_ms,   &ejection_ms,      &keepalive_ms,    &max_threads,
        &forget_ms,    &http_port,  &http_threads,     &http_timeout_ms, &internal_port}) {
    if (!v->ok()) return Fail(std::string(v->status().message()));
  }
  auto max_message_bytes = f->GetInt("max-message-bytes", 16 << 20);
  if (!max_message_bytes.ok()) return Fail(std::string(max_message_bytes.status().message()));
  if (*max_inflight < 1) return Fail("--max-inflight must be >= 1");
  if (*max_queued < 0) return Fail("--max-queued must be >= 0");
  if (*queue_timeout_ms < 0) return Fail("--queue-timeout-ms must be >= 0");
  if (*max_resumes < 0) return Fail("--max-resumes must be >= 0");
  if (*prefill_timeout_ms < 1) return Fail("--prefill-timeout-ms must be >= 1");
  if (*drain_ms < 0) return Fail("--drain-timeout-ms must be >= 0");
  if (*wedge_ms < 100) return Fail("--wedge-timeout-ms must be >= 100");
  if (*ejection_ms < 0) return Fail("--ejection-ms must be >= 0");
  if (*keepalive_ms < 1000) return Fail("--keepalive-ms must be >= 1000");
  if (*max_threads < 0) return Fail("--max-threads must be >= 0");
  auto faults = FaultSpec::Parse(f->Get("fault"));
  if (!faults.ok()) return Fail(std::string(faults.status().message()));
  if (*max_message_bytes < 1024 || *max_message_bytes > INT32_MAX) {
    return Fail("--max-message-bytes must be in [1024, 2^31)");
  }
  auto tls = LoadServerTls({f->Get("tls-cert"), f->Get("tls-key"), f->Get("tls-ca")});
  if (!tls.ok()) return Fail(std::string(tls.status().message()));
  HttpServerOptions http_options;
  http_options.host = f->Get("host", "127.0.0.1");
  http_options.port = static_cast<int>(*http_port);
  http_options.serve_metrics = f->Has("http-metrics");
  http_options.tls = {f->Get("tls-cert"), f->Get("tls-key"), f->Get("tls-ca")};
  http_options.threads = static_cast<int>(std::min<int64_t>(*http_threads, 1 << 14));
  if (*http_timeout_ms < 0) return Fail("--http-timeout-ms must be >= 0");
  if (*http_timeout_ms > 0) http_options.request_timeout = absl::Milliseconds(*http_timeout_ms);
  if (absl::Status s = http_options.Validate(); !s.ok()) {
    return Fail("--http-port/--http-threads: " + std::string(s.message()));
  }
  if (*port < 0 || *port > 65535) return Fail("--port must be in [0, 65535]");
  if (*internal_port < 0 || *internal_port > 65535) {
    return Fail("--internal-port must be in [0, 65535]");
  }
  if (*metrics_port < 0 || *metrics_port > 65535) {
    return Fail("--metrics-port must be in [0, 65535]");
  }
  const bool is_router = role == "router" || role == "all";
  const bool is_prefill = role == "prefill" || role == "all";
  const bool is_decode = role == "decode" || role == "all";
  if (role != "all" && role != "router" && !f->Has("router")) {
    return Fail("--router HOST:PORT is required for a worker");
  }
  if (role != "all" && role != "router" && f->Has("internal-port")) {
    return Fail("--internal-port is for a router: a worker's --port is its internal port");
  }
  // The cluster's credentials. Internal surfaces never run open: a secret, or mutual TLS whose
  // certificate names this process's roles. The colocated process talks to itself only, so
  // it makes a secret of its own when given none.
  std::optional<ClusterSecret> secret;
  if (f->Has("cluster-secret-file")) {
    auto loaded = ClusterSecret::Load(f->Get("cluster-secret-file"));
    if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
    secret = std::move(*loaded);
  } else if (role == "all") {
    secret = ClusterSecret::Generate();
  }
  RoleSet my_roles;
  if (is_router) my_roles = my_roles | PeerRole::kRouter;
  if (is_prefill) my_roles = my_roles | PeerRole::kPrefill;
  if (is_decode) my_roles = my_roles | PeerRole::kDecode;
  if (tls->mutual()) {
    const RoleSet cert_roles = RolesOfCertificate(tls->cert_pem);
    for (PeerRole r : {PeerRole::kRouter, PeerRole::kPrefill, PeerRole::kDecode}) {
      if (my_roles.Has(r) && !cert_roles.Has(r)) {
        return Fail(absl::StrFormat(
            "--tls-cert: under mutual TLS the certificate must name this process's role %s (a "
            "URI subject alternative name %s); it names %s",
            RoleName(r), RoleUri(r), cert_roles.ToString()));
      }
    }
  } else if (!secret) {
    return Fail(
        "--cluster-secret-file is required: internal calls and KV connections must prove the "
        "cluster's secret (make one with `openssl rand -hex 32 > FILE` and give every process "
        "of the cluster the same file), unless mutual TLS with role certificates is on");
  }
  auto internal_auth = std::make_shared<InternalAuth>(secret, tls->mutual());
  if (role != "all" && role != "router") {
    // A name that does not resolve yet is retried; a malformed one is an error now.
    auto resolved = ResolveHostPort(f->Get("router"));
    if (!resolved.ok() && absl::IsInvalidArgument(resolved.status())) {
      return Fail(std::string(resolved.status().message()));
    }
  }
  // The address other hosts reach this process at (registered with the router, put in KV
  // targets). A wildcard listening address cannot be advertised.
  const char* env_advertise = std::getenv("TANDEM_ADVERTISE_HOST");
  std::string advertise_host =
      f->Get("advertise-host", env_advertise != nullptr ? env_advertise : "");
  if (advertise_host.empty()) {
    if ((host == "0.0.0.0" || host == "::" || host == "[::]") && (is_prefill || is_decode) &&
        role != "all") {
      return Fail("--advertise-host is required when --host is a wildcard (" + host +
                  "); or set TANDEM_ADVERTISE_HOST (e.g. to the pod IP)");
    }
    advertise_host = host;
  }
  if (advertise_host.empty()) return Fail("--host must not be empty");
  if (advertise_host.front() == '[' && advertise_host.back() == ']') {
    advertise_host = advertise_host.substr(1, advertise_host.size() - 2);
  }
  auto kv_dtype = ParseKvDtype(f->Get("kv-dtype", "auto"));
  if (!kv_dtype.ok()) return Fail(std::string(kv_dtype.status().message()));
  auto admission = ParseKvAdmission(f->Get("kv-admission", "on-demand"));
  if (!admission.ok()) return Fail(std::string(admission.status().message()));
  auto watermark = f->GetDouble("kv-watermark", 0.01);
  if (!watermark.ok()) return Fail(std::string(watermark.status().message()));
  if (*watermark < 0 || *watermark >= 1) return Fail("--kv-watermark must be in [0, 1)");
  // The colocated mode moves KV in memory.
  const std::string kv_transport = f->Get("kv-transport", role == "all" ? "local" : "tcp");
  if (kv_transport != "tcp" && kv_transport != "local" && kv_transport != "nccl") {
    return Fail("--kv-transport must be tcp, local or nccl");
  }
  // NCCL: checked before the model loads, so a machine without it fails at once.
  std::optional<NcclTransportParts> nccl_parts;
  if (kv_transport == "nccl" && (is_prefill || is_decode)) {
    if (role == "all") {
      return Fail(
          "--kv-transport=nccl needs separate --role=prefill and --role=decode workers, each on "
          "its own GPU (NCCL cannot pair two ranks on one device); --role=all uses local");
    }
    auto nccl_device = f->GetInt("nccl-device", 0);
    if (!nccl_device.ok()) return Fail(std::string(nccl_device.status().message()));
    if (*nccl_device < 0 || *nccl_device > 1024) return Fail("--nccl-device must be in [0, 1024]");
    auto parts = LoadNcclTransport(static_cast<int>(*nccl_device));
    if (!parts.ok()) return Fail(std::string(parts.status().message()));
    nccl_parts = std::move(*parts);
  }

  // The metrics outlive every component that observes through them.
  auto metrics = std::make_shared<MetricsRegistry>(ModelLabel(model_path));
  std::unique_ptr<RouterMetrics> router_metrics;
  std::unique_ptr<PrefillMetrics> prefill_metrics;
  std::unique_ptr<DecodeMetrics> decode_metrics;
  if (is_router) router_metrics = std::make_unique<RouterMetrics>(*metrics);
  if (is_prefill) prefill_metrics = std::make_unique<PrefillMetrics>(*metrics);
  if (is_decode) decode_metrics = std::make_unique<DecodeMetrics>(*metrics);

  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::string device = "cpu";
  if (is_prefill || is_decode) {
    // The engines run on `device` (engine/model_runner.h); the host backend serves the rest
    // (prompt scoring) on the CPU.
    auto d = ResolveDevice(f->Get("device", "auto"));
    if (!d.ok()) return Fail(std::string(d.status().message()));
    device = *d;
    std::fprintf(stderr, "[tandem-server] device: %s\n", device.c_str());
    auto b = MakeBackend("cpu");
    if (!b.ok()) return Fail(std::string(b.status().message()));
    backend = std::move(*b);
    std::optional<DType> weight_dtype;
    if (f->Has("dtype")) {
      auto dt = ParseWeightDType(f->Get("dtype"));
      if (!dt.ok()) return Fail(std::string(dt.status().message()));
      weight_dtype = *dt;
    }
    auto m = Model::Load(model_path, backend.get(), weight_dtype);
    if (!m.ok()) return Fail(std::string(m.status().message()));
    model = std::move(*m);
  }

  std::unique_ptr<Router> router;
  openai::ServedModel served;
  if (is_router) {
    auto config = LoadModelConfig(model_path);
    if (!config.ok()) return Fail(std::string(config.status().message()));
    std::string tok_path;
    auto tok = LoadModelTokenizer(f->Get("tokenizer"), model_path, *config, &tok_path);
    if (!tok.ok()) return Fail(std::string(tok.status().message()));
    RouterOptions ro;
    ro.model_name = model_path;
    ro.heartbeat_interval_ms = static_cast<int>(*heartbeat);
    ro.registry.heartbeat_timeout = absl::Milliseconds(std::max<int64_t>(3 * *heartbeat, 1000));
    ro.registry.forget_after = absl::Milliseconds(*forget_ms);
    if (ro.registry.forget_after < ro.registry.heartbeat_timeout) {
      return Fail(absl::StrFormat("--forget-after-ms must be >= the heartbeat timeout (%d ms)",
                                  absl::ToInt64Milliseconds(ro.registry.heartbeat_timeout)));
    }
    ro.max_in_flight = static_cast<int>(*max_inflight);
    ro.max_queued = static_cast<int>(*max_queued);
    ro.queue_timeout = absl::Milliseconds(*queue_timeout_ms);
    ro.max_resumes = static_cast<int>(*max_resumes);
    ro.prefill_timeout = absl::Milliseconds(*prefill_timeout_ms);
    ro.registry.ejection = absl::Milliseconds(*ejection_ms);
    ro.keepalive_ms = static_cast<int>(*keepalive_ms);
    ro.worker_credentials = MakePeerChannelCredentials(*tls);
    ro.internal_auth = internal_auth;
    if (f->Has("api-keys-file")) {
      auto keys = ApiKeys::Load(f->Get("api-keys-file"));
      if (!keys.ok()) return Fail(std::string(keys.status().message()));
      ro.api_keys = std::move(*keys);
    }
    router = std::make_unique<Router>(*config, std::move(*tok), ro, router_metrics.get());
    served.id = f->Get("served-model-name", ModelLabel(model_path));
    served.max_context = config->max_seq_len;
    served.tokenizer = &router->tokenizer();
    served.chat_template = LoadChatTemplate(model_path, tok_path, f->Get("chat-template"));
    if (!served.chat_template.ok()) {
      // An explicit template must load; a model without one still serves /v1/completions.
      if (f->Has("chat-template")) {
        return Fail("--chat-template: " + std::string(served.chat_template.status().message()));
      }
      if (!absl::IsNotFound(served.chat_template.status())) {
        std::fprintf(stderr,
                     "[tandem-server] chat template unusable, chat requests will fail: %s\n",
                     std::string(served.chat_template.status().message()).c_str());
      }
    }
  }

  // Structured output: workers compile requests' JSON Schemas for the model's vocabulary, which
  // takes the tokenizer (under --role=all the router's; otherwise found as the router finds it).
  // Without one such requests are refused (FAILED_PRECONDITION) and everything else is served
  // as before.
  std::shared_ptr<OutputConstraints> constraints;
  if (is_prefill || is_decode) {
    if (router != nullptr) {  // outlives the engines: declared before them
      constraints = std::make_shared<OutputConstraints>(
          std::shared_ptr<const Tokenizer>(&router->tokenizer(), [](const Tokenizer*) {}));
    } else {
      std::string tok_path;
      auto tok = LoadModelTokenizer(f->Get("tokenizer"), model_path, model->config(), &tok_path);
      if (tok.ok()) {
        constraints =
            std::make_shared<OutputConstraints>(std::shared_ptr<const Tokenizer>(std::move(*tok)));
      } else if (!tok_path.empty()) {
        return Fail(std::string(tok.status().message()));
      } else {
        std::fprintf(stderr,
                     "[tandem-server] no tokenizer found beside the model: requests for "
                     "structured output (response_format) will be refused\n");
      }
    }
  }

  std::unique_ptr<KvSender> sender;
  std::unique_ptr<PrefillEngine> prefill;
  std::unique_ptr<PrefillService> prefill_service;
  if (is_prefill) {
    KvSenderOptions so;
    if (kv_transport == "tcp") {
      auto auth = MakeKvAuth(secret, *tls, /*receiver=*/false);
      if (!auth.ok()) return Fail(std::string(auth.status().message()));
      so.auth = std::move(*auth);
    }
    so.corrupt_chunk_index = faults->kv_corrupt_chunk;
    so.drop_chunk_index = faults->kv_drop_chunk;
    so.corrupt_every = faults->kv_corrupt_every;
    so.drop_every = faults->kv_drop_every;
    if (nccl_parts) {
      auto s = MakeNcclKvSender(*nccl_parts,
                                MakeGrpcNcclBootstrap(absl::StrFormat("prefill@%s", advertise_host),
                                                      MakePeerChannelCredentials(*tls),
                                                      internal_auth, so.connect_timeout),
                                so);
      if (!s.ok()) return Fail("--kv-transport=nccl: " + std::string(s.status().message()));
      sender = std::move(*s);
    } else {
      auto s = MakeKvSender(kv_transport, so);
      if (!s.ok()) return Fail(std::string(s.status().message()));
      sender = std::move(*s);
    }
    PrefillEngineOptions po;
    po.block_size = static_cast<int>(*block_size);
    po.num_blocks = static_cast<int>(*num_blocks);
    po.max_kv_bytes = *kv_bytes;
    po.scheduler.token_budget = static_cast<int>(*budget);
    po.scheduler.chunk_size = static_cast<int>(*chunk);
    po.prefix_cache = !f->Has("no-prefix-cache");
    po.faults = *faults;
    po.device = device;
    po.kv_dtype = *kv_dtype;
    po.constraints = constraints;
    auto p = PrefillEngine::Create(model.get(), sender.get(), po, prefill_metrics.get());
    if (!p.ok()) return Fail(std::string(p.status().message()));
    prefill = std::move(*p);
    prefill_service = std::make_unique<PrefillService>(prefill.get(), internal_auth);
  }
  std::unique_ptr<DecodeEngine> decode;
  std::unique_ptr<DecodeService> decode_service;
  NcclKvTransportReceiver* nccl_receiver = nullptr;  // owned by `decode`
  if (is_decode) {
    DecodeEngineOptions dopt;
    dopt.block_size = static_cast<int>(*block_size);
    dopt.num_blocks = static_cast<int>(*num_blocks);
    dopt.max_kv_bytes = *kv_bytes;
    dopt.max_running = static_cast<int>(*max_running);
    dopt.lease_timeout = absl::Milliseconds(*lease_ms);
    dopt.transport = kv_transport;
    dopt.advertise_host = advertise_host;
    dopt.faults = *faults;
    dopt.device = device;
    dopt.kv_dtype = *kv_dtype;
    dopt.admission = *admission;
    dopt.watermark = *watermark;
    dopt.constraints = constraints;
    if (kv_transport == "tcp") {
      auto auth = MakeKvAuth(secret, *tls, /*receiver=*/true);
      if (!auth.ok()) return Fail(std::string(auth.status().message()));
      dopt.receiver.auth = std::move(*auth);
    }
    dopt.listen =
        f->Get("kv-listen",
               kv_transport == "local" ? absl::StrFormat("decode-%d", ::getpid()) : host + ":0");
    if (nccl_parts) {
      dopt.make_receiver = [&](KvSink* sink) -> absl::StatusOr<std::unique_ptr<KvReceiver>> {
        std::unique_ptr<NcclKvTransportReceiver> r = MakeNcclKvReceiver(*nccl_parts, sink);
        nccl_receiver = r.get();
        return r;
      };
      dopt.kv_settle_timeout = absl::Seconds(5);
    }
    auto d = DecodeEngine::Create(model.get(), dopt, decode_metrics.get());
    if (!d.ok()) return Fail(std::string(d.status().message()));
    decode = std::move(*d);
    decode_service = std::make_unique<DecodeService>(decode.get(), internal_auth, nccl_receiver);
  }

  // Two gRPC servers. The internal one (the registry, the worker services) is built first:
  // server reflection is a process-wide plugin that joins every builder made after it is
  // enabled, and the internal port must not describe itself to strangers. Health is on both.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ResourceQuota quota("tandem-server");
  // The synchronous server runs each call on a thread: bound them, so a burst of thousands of
  // calls is refused (RESOURCE_EXHAUSTED) instead of growing memory without limit.
  quota.SetMaxThreads(static_cast<int>(
      *max_threads > 0 ? *max_threads : std::max<int64_t>(512, 2 * *max_inflight + 128)));
  auto configure = [&](grpc::ServerBuilder& builder, const std::string& listen, int* bound) {
    builder.AddListeningPort(listen, MakeServerCredentials(*tls), bound);
    builder.SetMaxReceiveMessageSize(static_cast<int>(*max_message_bytes));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(*keepalive_ms));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                               std::max(1000, static_cast<int>(*keepalive_ms) / 2));
    builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    // Peers (the router's channels) ping as often as every 1 s: allow it without GOAWAY.
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
    builder.SetResourceQuota(quota);
  };
  // Workers serve only the internal port, on --port; a router's internal port is
  // --internal-port.
  const int internal_listen_port = static_cast<int>(router ? *internal_port : *port);
  int internal_bound = 0;
  std::unique_ptr<grpc::Server> internal_server;
  {
    grpc::ServerBuilder builder;
    configure(builder, absl::StrFormat("%s:%d", host, internal_listen_port), &internal_bound);
    if (router) builder.RegisterService(router->registry_service());
    if (prefill_service) builder.RegisterService(prefill_service.get());
    if (decode_service) builder.RegisterService(decode_service.get());
    internal_server = builder.BuildAndStart();
    if (!internal_server || internal_bound == 0) {
      return Fail(absl::StrFormat("cannot listen on %s:%d", host, internal_listen_port));
    }
  }
  int bound_port = internal_bound;
  std::unique_ptr<grpc::Server> public_server;
  if (router) {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    grpc::ServerBuilder builder;
    configure(builder, absl::StrFormat("%s:%d", host, *port), &bound_port);
    builder.RegisterService(router->generation_service());
    public_server = builder.BuildAndStart();
    if (!public_server || bound_port == 0) {
      return Fail(absl::StrFormat("cannot listen on %s:%d", host, *port));
    }
  }
  const std::string internal_address = JoinHostPort(advertise_host, internal_bound);
  const std::string address = JoinHostPort(advertise_host, bound_port);
  if (nccl_receiver != nullptr) {
    // The KV endpoint is where prefill workers call NcclBootstrap: the internal server.
    nccl_receiver->SetBootstrapAddress(internal_address);
    decode->SetKvEndpoint(nccl_receiver->endpoint());
  }
  // Declared after the components: stops serving scrapes before they go away.
  auto metrics_server = MetricsServer::Start(host, static_cast<int>(*metrics_port), metrics);
  if (!metrics_server.ok()) return Fail(std::string(metrics_server.status().message()));
  std::unique_ptr<HttpServer> http_server;
  if (router) {
    auto h = HttpServer::Start(router.get(), std::move(served), router_metrics.get(), http_options);
    if (!h.ok()) return Fail(std::string(h.status().message()));
    http_server = std::move(*h);
  }

  // Health: NOT_SERVING while draining, while a step loop is wedged, and for a while after a
  // forward step failed (out of memory); the router reads it from the heartbeats too.
  std::vector<StepLoopHealth*> loops;  // the worker engines' step loops
  if (prefill) loops.push_back(&prefill->health());
  if (decode) loops.push_back(&decode->health());
  std::atomic<bool> serving{true};
  std::atomic<bool> draining{false};
  std::vector<grpc::HealthCheckServiceInterface*> health_services = {
      internal_server->GetHealthCheckService()};
  if (public_server) health_services.push_back(public_server->GetHealthCheckService());
  auto set_health = [&](bool ok) {
    for (auto* h : health_services) h->SetServingStatus(ok);
  };
  std::mutex monitor_mu;
  std::condition_variable monitor_cv;
  bool monitor_stop = false;
  std::thread monitor([&] {
    const absl::Duration wedge = absl::Milliseconds(*wedge_ms);
    std::unique_lock<std::mutex> lock(monitor_mu);
    while (!monitor_stop) {
      const absl::Time now = absl::Now();
      std::string why;
      if (draining) {
        why = "draining";
      } else if (std::any_of(loops.begin(), loops.end(),
                             [&](StepLoopHealth* l) { return l->SinceBeat() > wedge; })) {
        why = "step loop wedged";
      } else if (std::any_of(loops.begin(), loops.end(), [&](StepLoopHealth* l) {
                   return now - l->last_failed_step() < absl::Seconds(2);
                 })) {
        why = "forward step failed";
      }
      const bool ok = why.empty();
      if (ok != serving.load()) {
        serving = ok;
        set_health(ok);
        std::fprintf(stderr, "[tandem-server] health: %s%s\n",
                     ok ? "SERVING" : "NOT_SERVING: ", why.c_str());
      }
      monitor_cv.wait_for(lock, std::chrono::milliseconds(100));
    }
  });
  struct MonitorStopper {
    std::mutex& mu;
    std::condition_variable& cv;
    bool& stop;
    std::thread& t;
    ~MonitorStopper() {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      cv.notify_all();
      t.join();
    }
  } monitor_stopper{monitor_mu, monitor_cv, monitor_stop, monitor};

  std::vector<std::unique_ptr<RegistrationClient>> registrations;
  const std::string router_address = role == "all" ? internal_address : f->Get("router");
  auto register_worker = [&](v1::WorkerRole r, const char* suffix,
                             std::function<WorkerLoadSnapshot()> load) {
    v1::RegisterRequest req;
    req.set_worker_id(f->Get("worker-id", absl::StrFormat("%s-%s", internal_address, suffix)) +
                      (role == "all" ? std::string("-") + suffix : ""));
    req.set_role(r);
    req.set_address(internal_address);
    req.set_model(model_path);
    req.set_kv_transport(kv_transport);
    if (r == v1::WORKER_ROLE_DECODE) req.set_kv_endpoint(decode->kv_endpoint());
    req.set_kv_dtype(std::string(DTypeName(*kv_dtype)));
    RegistrationOptions ro;
    ro.credentials = MakePeerChannelCredentials(*tls);
    ro.auth = internal_auth;
    registrations.push_back(std::make_unique<RegistrationClient>(
        router_address, req, std::move(load), [&serving] { return serving.load(); },
        [&draining] { return draining.load(); }, ro));
  };
  if (prefill) {
    register_worker(v1::WORKER_ROLE_PREFILL, "prefill", [p = prefill.get()] { return p->Load(); });
    const WorkerLoadSnapshot l = prefill->Load();
    SetCacheConfigInfo(*metrics, "prefill", DTypeName(*kv_dtype), l.block_size, l.total_blocks);
  }
  if (decode) {
    register_worker(v1::WORKER_ROLE_DECODE, "decode", [d = decode.get()] { return d->Load(); });
    const WorkerLoadSnapshot l = decode->Load();
    SetCacheConfigInfo(*metrics, "decode", DTypeName(*kv_dtype), l.block_size, l.total_blocks);
  }
  // One write: a reader that stops after the first line still finds the others in the pipe.
  std::printf("listening %s\ninternal %s\nmetrics %s\n%s", address.c_str(),
              internal_address.c_str(), (*metrics_server)->address().c_str(),
              http_server ? ("http " + http_server->address() + "\n").c_str() : "");
  std::fflush(stdout);
  std::fprintf(stderr, "[tandem-server] role=%s listening on %s internal=%s metrics=%s%s\n",
               role.c_str(), address.c_str(), internal_address.c_str(),
               (*metrics_server)->address().c_str(),
               decode ? (" kv=" + decode->kv_endpoint()).c_str() : "");

  int sig = 0;
  sigwait(&signals, &sig);
  // Graceful drain: NOT_SERVING at once (health and heartbeats, so the router routes no new
  // work here), new work refused, in-flight work finished within the drain deadline.
  const absl::Time drain_until = absl::Now() + absl::Milliseconds(*drain_ms);
  std::fprintf(stderr, "[tandem-server] signal %d: draining (up to %d ms)\n", sig,
               static_cast<int>(*drain_ms));
  draining = true;
  serving = false;
  set_health(false);
  if (router) router->BeginDrain();
  for (StepLoopHealth* l : loops) l->BeginDrain();
  auto busy = [&] {
    return (router && router->InFlight() > 0) || (prefill && !prefill->Idle()) ||
           (decode && !decode->Idle());
  };
  while (busy() && absl::Now() < drain_until) absl::SleepFor(absl::Milliseconds(20));
  const bool drained = !busy();
  std::fprintf(stderr, "[tandem-server] %s; stopping\n",
               drained ? "drained" : "drain deadline passed with work in flight");
  http_server.reset();  // cancels what the drain left in flight
  registrations.clear();
  const auto stop_by = std::chrono::system_clock::now() + std::chrono::seconds(1);
  if (public_server) public_server->Shutdown(stop_by);
  internal_server->Shutdown(stop_by);
  if (public_server) public_server->Wait();
  internal_server->Wait();
  return 0;
}

}  // namespace tandem
