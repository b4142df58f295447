#include "server/server_main.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
#include "engine/kv/kv_budget.h"
#include "engine/kv/kv_cache.h"
#include "engine/model.h"
#include "engine/model_runner.h"
#include "engine/sampling/output_constraint.h"
#include "engine/step_loop_health.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "http/http_server.h"
#include "kernels/backend_loader.h"
#include "kernels/cpu/core_share.h"
#include "kv_transfer/kv_auth.h"
#include "kv_transfer/nccl/nccl_transport.h"
#include "metrics/metrics.h"
#include "metrics/metrics_server.h"
#include "prefill_node/nccl_bootstrap_client.h"
#include "prefill_node/prefill_engine.h"
#include "prefill_node/prefill_service.h"
#include "router/router.h"
#include "rpc/internal_auth.h"
#include "rpc/registration.h"
#include "rpc/server_reflection.h"
#include "rpc/tls.h"
#include "security/cluster_secret.h"
#include "server/listen_options.h"
#include "server/server_config.h"
#include "text/load_tokenizer.h"

namespace tandem {
namespace {

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

// One tandem-server process, built in phases (security, model, router, engines, ports,
// registration), each returning an error that names the flag; then it serves until a signal and
// drains. Members are declared in the order they are built, so they stop in reverse: the
// metrics outlive every component that observes through them, the servers stop before the
// engines behind them.
class TandemServer {
 public:
  explicit TandemServer(ServerConfig config) : c_(std::move(config)) {}
  ~TandemServer() { StopHealthMonitor(); }

  absl::Status Build();
  // Serves until one of `signals` arrives, then drains.
  void ServeUntilSignal(const sigset_t& signals);

 private:
  absl::Status SetUpSecurity();
  // Every port flag checked before the model loads (server/port_check.h).
  absl::Status CheckPorts();
  absl::Status ResolveAdvertiseHost();
  absl::Status LoadModel();
  absl::Status BuildRouter();
  absl::Status BuildConstraints();
  absl::Status BuildPrefill();
  absl::Status BuildDecode();
  // The decode KV budget without --kv-bytes: --kv-memory-fraction of the memory this worker may
  // use (the GPU's on CUDA, else the host's or its cgroup's) less the weights.
  absl::StatusOr<int64_t> DecodeKvBudget() const;
  // --speculative, --spec-tokens and --draft-model (loading the draft model).
  absl::Status ConfigureSpeculation(SpeculativeConfig* spec);
  absl::Status Listen();
  void ConfigureBuilder(grpc::ServerBuilder& builder, const std::string& listen, int* bound);
  void StartHealthMonitor();
  void StopHealthMonitor();
  void SetHealth(bool ok);
  void RegisterWorker(v1::WorkerRole r, const char* suffix,
                      std::function<WorkerLoadSnapshot()> load);
  bool Busy() const;

  const ServerConfig c_;
  // Security and the settings derived from the flags.
  TlsConfig tls_;
  std::optional<ClusterSecret> secret_;
  std::shared_ptr<InternalAuth> internal_auth_;
  std::string advertise_host_;
  std::string kv_transport_;
  DType kv_dtype_ = DType::kF32;
  FaultSpec faults_;
  std::optional<NcclTransportParts> nccl_parts_;
  // Metrics, then the components.
  std::shared_ptr<MetricsRegistry> metrics_;
  std::unique_ptr<RouterMetrics> router_metrics_;
  std::unique_ptr<PrefillMetrics> prefill_metrics_;
  std::unique_ptr<DecodeMetrics> decode_metrics_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Model> draft_model_;  // --speculative=draft
  std::string device_ = "cpu";
  std::unique_ptr<Router> router_;
  openai::ServedModel served_;
  std::shared_ptr<OutputConstraints> constraints_;
  std::unique_ptr<KvSender> sender_;
  std::unique_ptr<PrefillEngine> prefill_;
  std::unique_ptr<PrefillService> prefill_service_;
  std::unique_ptr<DecodeEngine> decode_;
  std::unique_ptr<DecodeService> decode_service_;
  NcclKvTransportReceiver* nccl_receiver_ = nullptr;  // owned by decode_
  // The ports.
  grpc::ResourceQuota quota_{"tandem-server"};
  std::unique_ptr<ServerReflectionV1> reflection_v1_;  // the public port's; outlives it
  std::unique_ptr<grpc::Server> internal_server_;
  std::unique_ptr<grpc::Server> public_server_;
  std::string internal_address_, address_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<HttpServer> http_server_;
  // Health: NOT_SERVING while draining, while a step loop is wedged, and for a while after a
  // forward step failed (out of memory); the router reads it from the heartbeats too.
  std::vector<StepLoopHealth*> loops_;  // the worker engines' step loops
  std::atomic<bool> serving_{true};
  std::atomic<bool> draining_{false};
  std::mutex monitor_mu_;
  std::condition_variable monitor_cv_;
  bool monitor_stop_ = false;
  std::thread monitor_;
  std::vector<std::unique_ptr<RegistrationClient>> registrations_;
};

absl::Status TandemServer::Build() {
  for (absl::Status (TandemServer::*phase)() :
       {&TandemServer::SetUpSecurity, &TandemServer::CheckPorts,
        &TandemServer::ResolveAdvertiseHost, &TandemServer::LoadModel, &TandemServer::BuildRouter,
        &TandemServer::BuildConstraints, &TandemServer::BuildPrefill, &TandemServer::BuildDecode,
        &TandemServer::Listen}) {
    if (absl::Status s = (this->*phase)(); !s.ok()) return s;
  }
  StartHealthMonitor();
  if (prefill_) {
    RegisterWorker(v1::WORKER_ROLE_PREFILL, "prefill", [p = prefill_.get()] { return p->Load(); });
    const WorkerLoadSnapshot l = prefill_->Load();
    SetCacheConfigInfo(*metrics_, "prefill", DTypeName(kv_dtype_), l.block_size, l.total_blocks);
  }
  if (decode_) {
    RegisterWorker(v1::WORKER_ROLE_DECODE, "decode", [d = decode_.get()] { return d->Load(); });
    const WorkerLoadSnapshot l = decode_->Load();
    SetCacheConfigInfo(*metrics_, "decode", DTypeName(kv_dtype_), l.block_size, l.total_blocks);
  }
  return absl::OkStatus();
}

absl::Status TandemServer::CheckPorts() { return CheckServerPorts(c_); }

// The cluster's credentials. Internal surfaces never run open: a secret, or mutual TLS whose
// certificate names this process's roles. The colocated process talks to itself only, so it
// makes a secret of its own when given none.
absl::Status TandemServer::SetUpSecurity() {
  auto faults = FaultSpec::Parse(c_.worker.fault);
  if (!faults.ok()) return faults.status();
  faults_ = *faults;
  auto tls = LoadServerTls({c_.common.tls_cert, c_.common.tls_key, c_.common.tls_ca});
  if (!tls.ok()) return tls.status();
  tls_ = std::move(*tls);
  if (!c_.common.cluster_secret_file.empty()) {
    auto loaded = ClusterSecret::Load(c_.common.cluster_secret_file);
    if (!loaded.ok()) return loaded.status();
    secret_ = std::move(*loaded);
  } else if (c_.common.role == "all") {
    secret_ = ClusterSecret::Generate();
  }
  RoleSet my_roles;
  if (c_.is_router()) my_roles = my_roles | PeerRole::kRouter;
  if (c_.is_prefill()) my_roles = my_roles | PeerRole::kPrefill;
  if (c_.is_decode()) my_roles = my_roles | PeerRole::kDecode;
  if (tls_.mutual()) {
    const RoleSet cert_roles = RolesOfCertificate(tls_.cert_pem);
    for (PeerRole r : {PeerRole::kRouter, PeerRole::kPrefill, PeerRole::kDecode}) {
      if (my_roles.Has(r) && !cert_roles.Has(r)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "--tls-cert: under mutual TLS the certificate must name this process's role %s (a "
            "URI subject alternative name %s); it names %s",
            RoleName(r), RoleUri(r), cert_roles.ToString()));
      }
    }
  } else if (!secret_) {
    return absl::InvalidArgumentError(
        "--cluster-secret-file is required: internal calls and KV connections must prove the "
        "cluster's secret (make one with `openssl rand -hex 32 > FILE` and give every process "
        "of the cluster the same file), unless mutual TLS with role certificates is on");
  }
  internal_auth_ = std::make_shared<InternalAuth>(secret_, tls_.mutual());
  if (c_.is_worker_process()) {
    // A name that does not resolve yet is retried; a malformed one is an error now.
    auto resolved = ResolveHostPort(c_.worker.router);
    if (!resolved.ok() && absl::IsInvalidArgument(resolved.status())) return resolved.status();
  }
  return absl::OkStatus();
}

// The address other hosts reach this process at (registered with the router, put in KV
// targets). A wildcard listening address cannot be advertised.
absl::Status TandemServer::ResolveAdvertiseHost() {
  const std::string& host = c_.common.host;
  const char* env_advertise = std::getenv("TANDEM_ADVERTISE_HOST");
  advertise_host_ = c_.common.advertise_host;
  if (advertise_host_.empty() && env_advertise != nullptr) advertise_host_ = env_advertise;
  if (advertise_host_.empty()) {
    if ((host == "0.0.0.0" || host == "::" || host == "[::]") && c_.is_worker_process()) {
      return absl::InvalidArgumentError("--advertise-host is required when --host is a wildcard (" +
                                        host +
                                        "); or set TANDEM_ADVERTISE_HOST (e.g. to the pod IP)");
    }
    advertise_host_ = host;
  }
  if (advertise_host_.front() == '[' && advertise_host_.back() == ']') {
    advertise_host_ = advertise_host_.substr(1, advertise_host_.size() - 2);
  }
  return absl::OkStatus();
}

absl::Status TandemServer::LoadModel() {
  auto kv_dtype = ParseKvDtype(c_.worker.kv_dtype);
  if (!kv_dtype.ok()) return kv_dtype.status();
  kv_dtype_ = *kv_dtype;
  kv_transport_ = c_.kv_transport();
  const bool worker = c_.is_prefill() || c_.is_decode();
  // NCCL: checked before the model loads, so a machine without it fails at once.
  if (kv_transport_ == "nccl" && worker) {
    auto parts = LoadNcclTransport(static_cast<int>(c_.worker.nccl_device));
    if (!parts.ok()) return parts.status();
    nccl_parts_ = std::move(*parts);
  }
  metrics_ = std::make_shared<MetricsRegistry>(ModelLabel(c_.common.model));
  if (c_.is_router()) router_metrics_ = std::make_unique<RouterMetrics>(*metrics_);
  if (c_.is_prefill()) prefill_metrics_ = std::make_unique<PrefillMetrics>(*metrics_);
  if (c_.is_decode()) decode_metrics_ = std::make_unique<DecodeMetrics>(*metrics_);
  if (!worker) return absl::OkStatus();
  // The engines run on `device_` (engine/model_runner.h); the host backend serves the rest
  // (prompt scoring) on the CPU.
  auto d = ResolveDevice(c_.common.device);
  if (!d.ok()) return d.status();
  device_ = *d;
  std::fprintf(stderr, "[tandem-server] device: %s\n", device_.c_str());
  auto b = MakeBackend("cpu");
  if (!b.ok()) return b.status();
  backend_ = std::move(*b);
  std::optional<DType> weight_dtype;
  if (!c_.worker.dtype.empty()) {
    auto dt = ParseWeightDType(c_.worker.dtype);
    if (!dt.ok()) return dt.status();
    weight_dtype = *dt;
  }
  auto m = Model::Load(c_.common.model, backend_.get(), weight_dtype);
  if (!m.ok()) return m.status();
  model_ = std::move(*m);
  if (device_ == "cuda" && c_.common.device == "auto") {
    if (absl::Status s = CudaSupportsModel(model_->config()); !s.ok()) {
      std::fprintf(stderr, "[tandem-server] device: cpu after all (%s)\n",
                   std::string(s.message()).c_str());
      device_ = "cpu";
    }
  }
  // "auto" depends on the device and the model (bf16 on CUDA where its attention has it).
  auto resolved = ResolveKvDtype(c_.worker.kv_dtype, device_, model_->config());
  if (!resolved.ok()) return resolved.status();
  kv_dtype_ = *resolved;
  // Colocated on the CPU, both engines run on one pool: running streams keep their pace while
  // prompts are prefilled (kernels/cpu/core_share.h).
  if (c_.common.role == "all" && device_ == "cpu") {
    CoreShare::Process().Enable(c_.prefill.colocated_prefill_share);
  }
  return absl::OkStatus();
}

absl::Status TandemServer::BuildRouter() {
  if (!c_.is_router()) return absl::OkStatus();
  const RouterConfig& rc = c_.router;
  const std::string& model_path = c_.common.model;
  auto config = LoadModelConfig(model_path);
  if (!config.ok()) return config.status();
  std::string tok_path;
  auto tok = LoadModelTokenizer(c_.common.tokenizer, model_path, *config, &tok_path);
  if (!tok.ok()) return tok.status();
  RouterOptions ro;
  // The served name, as /v1/models reports it (GetModelInfo.model).
  ro.model_name = rc.served_model_name.empty() ? ModelLabel(model_path) : rc.served_model_name;
  ro.heartbeat_interval_ms = static_cast<int>(rc.heartbeat_ms);
  ro.registry.heartbeat_timeout = absl::Milliseconds(std::max<int64_t>(3 * rc.heartbeat_ms, 1000));
  ro.registry.forget_after = absl::Milliseconds(rc.forget_after_ms);
  ro.max_in_flight = static_cast<int>(rc.max_inflight);
  ro.event_threads = static_cast<int>(rc.event_threads);
  ro.max_queued = static_cast<int>(rc.max_queued);
  ro.queue_timeout = absl::Milliseconds(rc.queue_timeout_ms);
  ro.max_resumes = static_cast<int>(rc.max_resumes);
  ro.prefill_timeout = absl::Milliseconds(rc.prefill_timeout_ms);
  ro.registry.ejection = absl::Milliseconds(rc.ejection_ms);
  ro.keepalive_ms = static_cast<int>(c_.common.keepalive_ms);
  ro.worker_credentials = MakePeerChannelCredentials(tls_);
  ro.internal_auth = internal_auth_;
  if (!rc.api_keys_file.empty()) {
    auto keys = ApiKeys::Load(rc.api_keys_file);
    if (!keys.ok()) return keys.status();
    ro.api_keys = std::move(*keys);
  }
  router_ = std::make_unique<Router>(*config, std::move(*tok), ro, router_metrics_.get());
  served_.id = ro.model_name;
  served_.max_context = config->max_seq_len;
  served_.tokenizer = &router_->tokenizer();
  served_.chat_template = LoadChatTemplate(model_path, tok_path, rc.chat_template);
  if (!served_.chat_template.ok()) {
    // An explicit template must load; a model without one still serves /v1/completions.
    if (!rc.chat_template.empty()) {
      return absl::InvalidArgumentError("--chat-template: " +
                                        std::string(served_.chat_template.status().message()));
    }
    if (!absl::IsNotFound(served_.chat_template.status())) {
      std::fprintf(stderr, "[tandem-server] chat template unusable, chat requests will fail: %s\n",
                   std::string(served_.chat_template.status().message()).c_str());
    }
  }
  return absl::OkStatus();
}

// Structured output: workers compile requests' JSON Schemas for the model's vocabulary, which
// takes the tokenizer (under --role=all the router's; otherwise found as the router finds it).
// Without one such requests are refused (FAILED_PRECONDITION) and everything else is served as
// before.
absl::Status TandemServer::BuildConstraints() {
  if (!c_.is_prefill() && !c_.is_decode()) return absl::OkStatus();
  if (router_ != nullptr) {  // outlives the engines: declared before them
    constraints_ = std::make_shared<OutputConstraints>(
        std::shared_ptr<const Tokenizer>(&router_->tokenizer(), [](const Tokenizer*) {}));
    return absl::OkStatus();
  }
  std::string tok_path;
  auto tok = LoadModelTokenizer(c_.common.tokenizer, c_.common.model, model_->config(), &tok_path);
  if (tok.ok()) {
    constraints_ =
        std::make_shared<OutputConstraints>(std::shared_ptr<const Tokenizer>(std::move(*tok)));
  } else if (!tok_path.empty()) {
    return tok.status();
  } else {
    std::fprintf(stderr,
                 "[tandem-server] no tokenizer found beside the model: requests for structured "
                 "output (response_format) will be refused\n");
  }
  return absl::OkStatus();
}

absl::Status TandemServer::BuildPrefill() {
  if (!c_.is_prefill()) return absl::OkStatus();
  KvSenderOptions so;
  if (kv_transport_ == "tcp") {
    auto auth = MakeKvAuth(secret_, tls_, /*receiver=*/false);
    if (!auth.ok()) return auth.status();
    so.auth = std::move(*auth);
  }
  so.corrupt_chunk_index = faults_.kv_corrupt_chunk;
  so.drop_chunk_index = faults_.kv_drop_chunk;
  so.corrupt_every = faults_.kv_corrupt_every;
  so.drop_every = faults_.kv_drop_every;
  if (nccl_parts_) {
    auto s = MakeNcclKvSender(
        *nccl_parts_,
        MakeGrpcNcclBootstrap(absl::StrFormat("prefill@%s", advertise_host_),
                              MakePeerChannelCredentials(tls_), internal_auth_, so.connect_timeout),
        so);
    if (!s.ok()) {
      return absl::Status(s.status().code(),
                          "--kv-transport=nccl: " + std::string(s.status().message()));
    }
    sender_ = std::move(*s);
  } else {
    auto s = MakeKvSender(kv_transport_, so);
    if (!s.ok()) return s.status();
    sender_ = std::move(*s);
  }
  PrefillEngineOptions po;
  po.block_size = static_cast<int>(c_.worker.block_size);
  po.num_blocks = static_cast<int>(c_.worker.num_blocks);
  po.max_kv_bytes = c_.worker.kv_bytes;
  if (po.max_kv_bytes == 0) {
    // 1 GiB for prompts in flight and the prefix cache, or one context-length prompt's KV where
    // that is more (Gemma 3 270M: 32,768 tokens of 36 KiB).
    const KvCacheSpec spec = KvCacheSpec::For(model_->config(), po.block_size, kv_dtype_);
    const int64_t context_blocks = spec.table_layout().Entries(model_->config().max_seq_len);
    po.max_kv_bytes = std::max(int64_t{1} << 30, context_blocks * spec.bytes_per_block());
  }
  po.scheduler.token_budget = static_cast<int>(c_.prefill.token_budget);
  po.scheduler.chunk_size = static_cast<int>(c_.prefill.prefill_chunk);
  po.prefix_cache = !c_.prefill.no_prefix_cache;
  po.faults = faults_;
  po.device = device_;
  po.kv_dtype = kv_dtype_;
  po.constraints = constraints_;
  auto p = PrefillEngine::Create(model_.get(), sender_.get(), po, prefill_metrics_.get());
  if (!p.ok()) return p.status();
  prefill_ = std::move(*p);
  prefill_service_ = std::make_unique<PrefillService>(prefill_.get(), internal_auth_);
  return absl::OkStatus();
}

absl::Status TandemServer::ConfigureSpeculation(SpeculativeConfig* spec) {
  auto method = ParseSpeculativeMethod(c_.decode.speculative);
  if (!method.ok()) return method.status();
  spec->method = *method;
  spec->num_tokens = static_cast<int>(c_.decode.spec_tokens);
  if (spec->method != SpeculativeMethod::kDraft) return absl::OkStatus();
  // Loaded on the host as stored; the decode engine puts it on its device.
  auto draft = Model::Load(c_.decode.draft_model, backend_.get());
  if (!draft.ok()) {
    return absl::Status(draft.status().code(),
                        absl::StrCat("--draft-model: ", draft.status().message()));
  }
  draft_model_ = std::move(*draft);
  spec->draft = draft_model_.get();
  return absl::OkStatus();
}

absl::Status TandemServer::BuildDecode() {
  if (!c_.is_decode()) return absl::OkStatus();
  auto admission = ParseKvAdmission(c_.decode.kv_admission);
  if (!admission.ok()) return admission.status();
  DecodeEngineOptions dopt;
  dopt.block_size = static_cast<int>(c_.worker.block_size);
  dopt.num_blocks = static_cast<int>(c_.worker.num_blocks);
  dopt.max_kv_bytes = c_.worker.kv_bytes;
  if (dopt.num_blocks == 0 && dopt.max_kv_bytes == 0) {
    auto budget = DecodeKvBudget();
    if (!budget.ok()) return budget.status();
    dopt.max_kv_bytes = *budget;
  }
  dopt.max_running = static_cast<int>(c_.decode.max_running);
  dopt.lease_timeout = absl::Milliseconds(c_.decode.lease_timeout_ms);
  dopt.transport = kv_transport_;
  dopt.advertise_host = advertise_host_;
  dopt.faults = faults_;
  dopt.device = device_;
  dopt.kv_dtype = kv_dtype_;
  dopt.admission = *admission;
  dopt.watermark = c_.decode.kv_watermark;
  dopt.constraints = constraints_;
  if (absl::Status s = ConfigureSpeculation(&dopt.speculative); !s.ok()) return s;
  if (kv_transport_ == "tcp") {
    auto auth = MakeKvAuth(secret_, tls_, /*receiver=*/true);
    if (!auth.ok()) return auth.status();
    dopt.receiver.auth = std::move(*auth);
  }
  dopt.listen = c_.decode.kv_listen;
  if (dopt.listen.empty()) {
    dopt.listen =
        kv_transport_ == "local" ? absl::StrFormat("decode-%d", ::getpid()) : c_.common.host + ":0";
  }
  if (nccl_parts_) {
    dopt.make_receiver = [this](KvSink* sink) -> absl::StatusOr<std::unique_ptr<KvReceiver>> {
      std::unique_ptr<NcclKvTransportReceiver> r = MakeNcclKvReceiver(*nccl_parts_, sink);
      nccl_receiver_ = r.get();
      return r;
    };
    dopt.kv_settle_timeout = absl::Seconds(5);
  }
  auto d = DecodeEngine::Create(model_.get(), dopt, decode_metrics_.get());
  if (!d.ok()) return d.status();
  decode_ = std::move(*d);
  decode_service_ = std::make_unique<DecodeService>(decode_.get(), internal_auth_, nccl_receiver_);
  const WorkerLoadSnapshot load = decode_->Load();
  const KvCacheSpec& spec = decode_->kv_spec();
  // A grouped cache (sliding-window and full-attention layers) holds a block per group per
  // block_size tokens; its tokens are those of the longest sequence it holds.
  std::fprintf(stderr,
               "[tandem-server] decode KV cache: %d blocks of %d tokens (%lld tokens, %.2f GiB, "
               "%s%s)\n",
               load.total_blocks, load.block_size,
               static_cast<long long>(load.kv_layout().TokensIn(load.total_blocks)),
               static_cast<double>(spec.bytes_per_block()) * load.total_blocks / (1 << 30),
               DTypeName(kv_dtype_).data(),
               spec.n_groups() > 1
                   ? absl::StrFormat(", %d layer groups of %d layers; sliding-window blocks go "
                                     "once behind the window",
                                     spec.n_groups(), spec.group_layers())
                         .c_str()
                   : "");
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TandemServer::DecodeKvBudget() const {
  int64_t memory = 0;
  const char* of = "host";
  if (device_ == "cuda") {
    auto api = LoadCudaApi();
    if (!api.ok()) return api.status();
    size_t free_bytes = 0, total_bytes = 0;
    if ((*api)->device_memory(&free_bytes, &total_bytes) != 0) {
      return absl::InternalError(absl::StrFormat("--kv-memory-fraction: %s", (*api)->last_error()));
    }
    memory = static_cast<int64_t>(total_bytes);
    of = "GPU";
  } else {
    auto host = HostMemoryBytes();
    if (!host.ok()) return host.status();
    memory = *host;
  }
  const int64_t weights = WeightBytes(model_->config(), model_->weights());
  const double f = c_.worker.kv_memory_fraction;
  const int64_t budget = KvBytesFromFraction(f, memory, weights);
  std::fprintf(stderr,
               "[tandem-server] --kv-memory-fraction %.2f of %.2f GiB (%s) less %.2f GiB of "
               "weights: %.2f GiB for the decode KV cache\n",
               f, static_cast<double>(memory) / (1 << 30), of,
               static_cast<double>(weights) / (1 << 30), static_cast<double>(budget) / (1 << 30));
  if (budget <= 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "--kv-memory-fraction %.2f of %.2f GiB leaves no room for the KV cache after %.2f GiB of "
        "weights; raise it or give --kv-bytes",
        f, static_cast<double>(memory) / (1 << 30), static_cast<double>(weights) / (1 << 30)));
  }
  return budget;
}

void TandemServer::ConfigureBuilder(grpc::ServerBuilder& builder, const std::string& listen,
                                    int* bound) {
  const int keepalive_ms = static_cast<int>(c_.common.keepalive_ms);
  builder.AddListeningPort(listen, MakeServerCredentials(tls_), bound);
  builder.SetMaxReceiveMessageSize(static_cast<int>(c_.common.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(1000, keepalive_ms / 2));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // Peers (the router's channels) ping as often as every 1 s: allow it without GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.SetResourceQuota(quota_);
}

// Two gRPC servers: the internal one (the registry, the worker services), without server
// reflection (gRPC's plugin joins every builder of the process; the internal port must not
// describe itself to strangers), and the router's public one, with reflection v1alpha and v1.
// Health is on both. Then the metrics port and the router's HTTP API.
absl::Status TandemServer::Listen() {
  HttpServerOptions http_options;
  if (router_) {
    absl::StatusOr<HttpServerOptions> o = RouterHttpOptions(c_);
    if (!o.ok()) return o.status();
    http_options = *std::move(o);
  }
  grpc::EnableDefaultHealthCheckService(true);
  // The synchronous server runs each unary call (and each worker's stream) on a thread: bound
  // them, so a burst of thousands of calls is refused (RESOURCE_EXHAUSTED) instead of growing
  // memory without limit. The router's Generate streams are on the callback API and hold none.
  const int64_t max_threads = c_.common.max_threads;
  quota_.SetMaxThreads(static_cast<int>(max_threads > 0 ? max_threads : 2048));
  const std::string& host = c_.common.host;
  // Workers serve only the internal port, on --port; a router's internal port is
  // --internal-port.
  const int internal_listen_port =
      static_cast<int>(router_ ? c_.router.internal_port : c_.common.port);
  int internal_bound = 0;
  {
    grpc::ServerBuilder builder;
    ConfigureBuilder(builder, absl::StrFormat("%s:%d", host, internal_listen_port),
                     &internal_bound);
    builder.SetOption(std::make_unique<WithoutReflection>());
    if (router_) builder.RegisterService(router_->registry_service());
    if (prefill_service_) builder.RegisterService(prefill_service_.get());
    if (decode_service_) builder.RegisterService(decode_service_.get());
    internal_server_ = builder.BuildAndStart();
    if (!internal_server_ || internal_bound == 0) {
      return absl::UnavailableError(
          absl::StrFormat("cannot listen on %s:%d", host, internal_listen_port));
    }
    // Health also answers for each service by name (grpc.health.v1 Check with a service, as
    // Kubernetes' grpc probe and grpc-health-probe -service send it), following SetHealth.
    grpc::HealthCheckServiceInterface* health = internal_server_->GetHealthCheckService();
    if (router_) health->SetServingStatus(v1::Registry::service_full_name(), true);
    if (prefill_service_) health->SetServingStatus(v1::PrefillWorker::service_full_name(), true);
    if (decode_service_) health->SetServingStatus(v1::DecodeWorker::service_full_name(), true);
  }
  int bound_port = internal_bound;
  if (router_) {
    // Reflection v1alpha (gRPC's plugin) and v1 (ours, the same answers), as grpcurl asks.
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    reflection_v1_ = std::make_unique<ServerReflectionV1>(std::vector<std::string>{
        v1::Generation::service_full_name(), grpc::health::v1::Health::service_full_name(),
        "grpc.reflection.v1alpha.ServerReflection",
        grpc::reflection::v1::ServerReflection::service_full_name()});
    grpc::ServerBuilder builder;
    ConfigureBuilder(builder, absl::StrFormat("%s:%d", host, c_.common.port), &bound_port);
    builder.RegisterService(router_->generation_service());
    builder.RegisterService(reflection_v1_.get());
    public_server_ = builder.BuildAndStart();
    if (!public_server_ || bound_port == 0) {
      return absl::UnavailableError(
          absl::StrFormat("cannot listen on %s:%d", host, c_.common.port));
    }
    public_server_->GetHealthCheckService()->SetServingStatus(v1::Generation::service_full_name(),
                                                              true);
  }
  internal_address_ = JoinHostPort(advertise_host_, internal_bound);
  address_ = JoinHostPort(advertise_host_, bound_port);
  if (nccl_receiver_ != nullptr) {
    // The KV endpoint is where prefill workers call NcclBootstrap: the internal server.
    nccl_receiver_->SetBootstrapAddress(internal_address_);
    decode_->SetKvEndpoint(nccl_receiver_->endpoint());
  }
  auto metrics_server =
      MetricsServer::Start(host, static_cast<int>(c_.common.metrics_port), metrics_);
  if (!metrics_server.ok()) return metrics_server.status();
  metrics_server_ = std::move(*metrics_server);
  if (router_) {
    auto h =
        HttpServer::Start(router_.get(), std::move(served_), router_metrics_.get(), http_options);
    if (!h.ok()) return h.status();
    http_server_ = std::move(*h);
  }
  return absl::OkStatus();
}

void TandemServer::SetHealth(bool ok) {
  internal_server_->GetHealthCheckService()->SetServingStatus(ok);
  if (public_server_) public_server_->GetHealthCheckService()->SetServingStatus(ok);
}

void TandemServer::StartHealthMonitor() {
  if (prefill_) loops_.push_back(&prefill_->health());
  if (decode_) loops_.push_back(&decode_->health());
  monitor_ = std::thread([this] {
    const absl::Duration wedge = absl::Milliseconds(c_.worker.wedge_timeout_ms);
    std::unique_lock<std::mutex> lock(monitor_mu_);
    while (!monitor_stop_) {
      const absl::Time now = absl::Now();
      std::string why;
      if (draining_) {
        why = "draining";
      } else if (std::any_of(loops_.begin(), loops_.end(),
                             [&](StepLoopHealth* l) { return l->SinceProgress() > wedge; })) {
        why = "step loop wedged";
      } else if (std::any_of(loops_.begin(), loops_.end(), [&](StepLoopHealth* l) {
                   return now - l->last_failed_step() < absl::Seconds(2);
                 })) {
        why = "forward step failed";
      }
      const bool ok = why.empty();
      if (ok != serving_.load()) {
        serving_ = ok;
        SetHealth(ok);
        std::fprintf(stderr, "[tandem-server] health: %s%s\n",
                     ok ? "SERVING" : "NOT_SERVING: ", why.c_str());
      }
      monitor_cv_.wait_for(lock, std::chrono::milliseconds(100));
    }
  });
}

void TandemServer::StopHealthMonitor() {
  if (!monitor_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(monitor_mu_);
    monitor_stop_ = true;
  }
  monitor_cv_.notify_all();
  monitor_.join();
}

void TandemServer::RegisterWorker(v1::WorkerRole r, const char* suffix,
                                  std::function<WorkerLoadSnapshot()> load) {
  const bool colocated = c_.common.role == "all";
  v1::RegisterRequest req;
  const std::string id = c_.worker.worker_id.empty()
                             ? absl::StrFormat("%s-%s", internal_address_, suffix)
                             : c_.worker.worker_id;
  req.set_worker_id(id + (colocated ? std::string("-") + suffix : ""));
  req.set_role(r);
  req.set_address(internal_address_);
  req.set_model(c_.common.model);
  req.set_kv_transport(kv_transport_);
  if (r == v1::WORKER_ROLE_DECODE) req.set_kv_endpoint(decode_->kv_endpoint());
  req.set_kv_dtype(std::string(DTypeName(kv_dtype_)));
  req.set_instance_id(internal_auth_->instance_id());
  RegistrationOptions ro;
  ro.credentials = MakePeerChannelCredentials(tls_);
  ro.auth = internal_auth_;
  registrations_.push_back(std::make_unique<RegistrationClient>(
      colocated ? internal_address_ : c_.worker.router, req, std::move(load),
      [this] { return serving_.load(); }, [this] { return draining_.load(); }, ro));
}

bool TandemServer::Busy() const {
  return (router_ && router_->InFlight() > 0) || (prefill_ && !prefill_->Idle()) ||
         (decode_ && !decode_->Idle());
}

void TandemServer::ServeUntilSignal(const sigset_t& signals) {
  // One write: a reader that stops after the first line still finds the others in the pipe.
  std::printf("listening %s\ninternal %s\nmetrics %s\n%s", address_.c_str(),
              internal_address_.c_str(), metrics_server_->address().c_str(),
              http_server_ ? ("http " + http_server_->address() + "\n").c_str() : "");
  std::fflush(stdout);
  std::fprintf(stderr, "[tandem-server] role=%s listening on %s internal=%s metrics=%s%s\n",
               c_.common.role.c_str(), address_.c_str(), internal_address_.c_str(),
               metrics_server_->address().c_str(),
               decode_ ? (" kv=" + decode_->kv_endpoint()).c_str() : "");
  int sig = 0;
  sigwait(&signals, &sig);
  // Graceful drain: NOT_SERVING at once (health and heartbeats, so the router routes no new
  // work here), new work refused, in-flight work finished within the drain deadline.
  const int64_t drain_ms = c_.common.drain_timeout_ms;
  const absl::Time drain_until = absl::Now() + absl::Milliseconds(drain_ms);
  std::fprintf(stderr, "[tandem-server] signal %d: draining (up to %d ms)\n", sig,
               static_cast<int>(drain_ms));
  draining_ = true;
  serving_ = false;
  SetHealth(false);
  if (router_) router_->BeginDrain();
  for (StepLoopHealth* l : loops_) l->BeginDrain();
  while (Busy() && absl::Now() < drain_until) absl::SleepFor(absl::Milliseconds(20));
  std::fprintf(stderr, "[tandem-server] %s; stopping\n",
               Busy() ? "drain deadline passed with work in flight" : "drained");
  http_server_.reset();  // cancels what the drain left in flight
  registrations_.clear();
  const auto stop_by = std::chrono::system_clock::now() + std::chrono::seconds(1);
  if (public_server_) public_server_->Shutdown(stop_by);
  internal_server_->Shutdown(stop_by);
  if (public_server_) public_server_->Wait();
  internal_server_->Wait();
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

  ServerCommandLine cl = ParseServerFlags(argc, argv, fixed_role);
  if (cl.exit) return cl.exit_code;
  // Niceness is per thread on Linux and inherited by the threads a thread starts: set on the
  // only thread there is, it holds for every thread the server starts.
  if (const int64_t nice = cl.config.common.cpu_nice;
      nice != 0 && ::setpriority(PRIO_PROCESS, 0, static_cast<int>(nice)) != 0) {
    std::fprintf(stderr, "tandem-server: --cpu-nice %lld: %s\n", static_cast<long long>(nice),
                 std::strerror(errno));
    return 2;
  }
  // The scheduling policy is inherited the same way.
  if (const sched_param param{};
      cl.config.common.cpu_idle && ::sched_setscheduler(0, SCHED_IDLE, &param) != 0) {
    std::fprintf(stderr, "tandem-server: --cpu-idle: %s\n", std::strerror(errno));
    return 2;
  }
  TandemServer server(std::move(cl.config));
  if (absl::Status s = server.Build(); !s.ok()) {
    std::fprintf(stderr, "tandem-server: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  server.ServeUntilSignal(signals);
  return 0;
}

}  // namespace tandem
