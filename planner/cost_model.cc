#include "planner/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "planner/measured_profiles.h"

namespace tandem::planner {

namespace {

constexpr double kGB = 1e9;

// Datasheet figures (dense bf16 tensor-core FLOP/s, HBM/GDDR bandwidth, capacity, NVLink or
// PCIe per direction). Efficiencies and overheads are typical of a tuned serving engine (CUDA
// graphs for decode, FlashAttention-style kernels), not measured here: a calibrated profile
// file replaces them.
HardwareProfile Gpu(std::string name, double tflops, double tbps, double gb, int max_tp,
                    double tp_gbps, Link link) {
  HardwareProfile p;
  p.name = std::move(name);
  p.peak_flops = tflops * 1e12;
  p.mem_bandwidth = tbps * 1e12;
  p.mem_capacity = gb * kGB;
  p.mem_utilization = 0.9;
  p.matmul_efficiency = 0.7;
  p.attention_efficiency = 0.5;
  p.bandwidth_efficiency = 0.85;
  p.step_overhead = 0.5e-3;
  p.overlap = true;
  p.weight_bytes = 2;
  p.kv_bytes = 2;
  p.act_bytes = 2;
  p.max_tp = max_tp;
  p.tp_bandwidth = tp_gbps * kGB;
  p.tp_latency = 10e-6;
  p.kv_link = std::move(link);
  p.shared_host = false;
  p.request_overhead = 2e-3;
  p.token_overhead = 0.2e-3;
  return p;
}

const std::vector<Link>& NamedLinks() {
  static const auto* links = new std::vector<Link>{
      {"nvlink", 450 * kGB, 5e-6},      // NVLink 4, per direction
      {"infiniband", 50 * kGB, 10e-6},  // 400 Gb/s NDR
      {"roce", 25 * kGB, 15e-6},        // 200 GbE
      {"tcp", 1.25 * kGB, 50e-6},       // 10 GbE, kernel TCP
      {"loopback", 2 * kGB, 100e-6},    // tcp on 127.0.0.1 with a per-chunk acknowledgement
  };
  return *links;
}

Link NamedLink(const std::string& name) {
  for (const Link& l : NamedLinks()) {
    if (l.name == name) return l;
  }
  return {};
}

std::vector<HardwareProfile> Datasheets() {
  return {
      Gpu("h100-sxm", 989, 3.35, 80, 8, 450, NamedLink("infiniband")),
      Gpu("h200-datasheet", 989, 4.8, 141, 8, 450, NamedLink("infiniband")),
      Gpu("a100-80gb", 312, 2.039, 80, 8, 300, NamedLink("infiniband")),
      Gpu("l40s", 362, 0.864, 48, 4, 32, NamedLink("roce")),
  };
}

// The profiles fitted to device runs (planner/profiles/*.json, compiled in): name, JSON.
constexpr std::pair<const char*, const char*> kMeasured[] = {
    {"h200", kMeasuredProfileH200},
};

}  // namespace

absl::Status HardwareProfile::Validate() const {
  auto positive = [](double v, const char* field) -> absl::Status {
    if (!(v > 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("profile.%s must be > 0, got %g", field, v));
    }
    return absl::OkStatus();
  };
  auto nonneg = [](double v, const char* field) -> absl::Status {
    if (!(v >= 0) || !std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("profile.%s must be >= 0, got %g", field, v));
    }
    return absl::OkStatus();
  };
  for (auto s : {positive(peak_flops, "peak_flops"),
                 positive(mem_bandwidth, "mem_bandwidth"),
                 positive(mem_capacity, "mem_capacity"),
                 positive(matmul_efficiency, "matmul_efficiency"),
                 positive(attention_efficiency, "attention_efficiency"),
                 positive(bandwidth_efficiency, "bandwidth_efficiency"),
                 positive(weight_bytes, "weight_bytes"),
                 positive(kv_bytes, "kv_bytes"),
                 positive(act_bytes, "act_bytes"),
                 nonneg(step_overhead, "step_overhead"),
                 nonneg(tp_bandwidth, "tp_bandwidth"),
                 nonneg(tp_latency, "tp_latency"),
                 positive(kv_link.bandwidth, "kv_link.bandwidth"),
                 nonneg(kv_link.latency, "kv_link.latency"),
                 nonneg(request_overhead, "request_overhead"),
                 nonneg(token_overhead, "token_overhead"),
                 nonneg(relay_cpu, "relay_cpu"),
                 nonneg(sample_cpu, "sample_cpu"),
                 nonneg(decode_start_overhead, "decode_start_overhead"),
                 nonneg(request_jitter, "request_jitter"),
                 nonneg(decode_start_jitter, "decode_start_jitter"),
                 nonneg(step_jitter, "step_jitter")}) {
    if (!s.ok()) return s;
  }
  for (const auto& [has, d, role] :
       {std::tuple{has_decode_factors, decode_factors, std::string("decode.")},
        std::tuple{has_prefill_factors, prefill_factors, std::string("prefill.")}}) {
    if (!has) continue;
    for (auto s : {positive(d.matmul_efficiency, (role + "matmul_efficiency").c_str()),
                   positive(d.attention_efficiency, (role + "attention_efficiency").c_str()),
                   positive(d.bandwidth_efficiency, (role + "bandwidth_efficiency").c_str()),
                   nonneg(d.step_overhead, (role + "step_overhead").c_str())}) {
      if (!s.ok()) return s;
    }
  }
  if (!(host_step_slots >= 1 && host_step_slots <= 1024)) {
    return absl::InvalidArgumentError("profile.host_step_slots must be in [1, 1024]");
  }
  if (!(host_cores == 0 || (host_cores >= 1 && host_cores <= 4096))) {
    return absl::InvalidArgumentError("profile.host_cores must be 0 or in [1, 4096]");
  }
  if (!(step_threads >= 1 && step_threads <= std::max(1.0, host_cores))) {
    return absl::InvalidArgumentError("profile.step_threads must be in [1, host_cores]");
  }
  if (!(prefill_step_jitter < 0 || prefill_step_jitter <= 10)) {
    return absl::InvalidArgumentError("profile.prefill_step_jitter must be at most 10");
  }
  if (!(prefill_threads >= 0 && prefill_threads <= std::max(1.0, host_cores))) {
    return absl::InvalidArgumentError("profile.prefill_threads must be in [0, host_cores]");
  }
  if (!(prefill_yield >= 0 && prefill_yield <= 1)) {
    return absl::InvalidArgumentError("profile.prefill_yield must be in [0, 1]");
  }
  if (!(mem_utilization > 0 && mem_utilization <= 1)) {
    return absl::InvalidArgumentError("profile.mem_utilization must be in (0, 1]");
  }
  if (max_tp < 1 || max_tp > 64)
    return absl::InvalidArgumentError("profile.max_tp must be in [1, 64]");
  if (max_tp > 1 && tp_bandwidth <= 0) {
    return absl::InvalidArgumentError("profile.tp_bandwidth must be > 0 when max_tp > 1");
  }
  return absl::OkStatus();
}

nlohmann::json HardwareProfile::ToJson() const {
  nlohmann::json j = {
      {"name", name},
      {"peak_flops", peak_flops},
      {"mem_bandwidth", mem_bandwidth},
      {"mem_capacity", mem_capacity},
      {"mem_utilization", mem_utilization},
      {"matmul_efficiency", matmul_efficiency},
      {"attention_efficiency", attention_efficiency},
      {"bandwidth_efficiency", bandwidth_efficiency},
      {"step_overhead", step_overhead},
      {"overlap", overlap},
      {"weight_bytes", weight_bytes},
      {"kv_bytes", kv_bytes},
      {"act_bytes", act_bytes},
      {"max_tp", max_tp},
      {"tp_bandwidth", tp_bandwidth},
      {"tp_latency", tp_latency},
      {"kv_link",
       {{"name", kv_link.name}, {"bandwidth", kv_link.bandwidth}, {"latency", kv_link.latency}}},
      {"shared_host", shared_host},
      {"request_overhead", request_overhead},
      {"token_overhead", token_overhead},
      {"relay_cpu", relay_cpu},
      {"sample_cpu", sample_cpu},
      {"decode_start_overhead", decode_start_overhead},
      {"request_jitter", request_jitter},
      {"decode_start_jitter", decode_start_jitter},
      {"step_jitter", step_jitter}};
  auto factors = [](const StepFactors& f) {
    return nlohmann::json{{"matmul_efficiency", f.matmul_efficiency},
                          {"attention_efficiency", f.attention_efficiency},
                          {"bandwidth_efficiency", f.bandwidth_efficiency},
                          {"step_overhead", f.step_overhead}};
  };
  if (has_decode_factors) j["decode"] = factors(decode_factors);
  if (has_prefill_factors) j["prefill"] = factors(prefill_factors);
  if (host_step_slots != 1) j["host_step_slots"] = host_step_slots;
  if (prefill_step_jitter >= 0) j["prefill_step_jitter"] = prefill_step_jitter;
  if (host_cores != 0) j["host_cores"] = host_cores;
  if (step_threads != 1) j["step_threads"] = step_threads;
  if (prefill_threads != 0) j["prefill_threads"] = prefill_threads;
  if (prefill_yield != 0) j["prefill_yield"] = prefill_yield;
  if (!provenance.empty()) j["provenance"] = provenance;
  return j;
}

namespace {

HardwareProfile WithFactors(HardwareProfile p, bool has, const HardwareProfile::StepFactors& f) {
  if (has) {
    p.matmul_efficiency = f.matmul_efficiency;
    p.attention_efficiency = f.attention_efficiency;
    p.bandwidth_efficiency = f.bandwidth_efficiency;
    p.step_overhead = f.step_overhead;
  }
  return p;
}

}  // namespace

HardwareProfile HardwareProfile::ForDecode() const {
  return WithFactors(*this, has_decode_factors, decode_factors);
}

HardwareProfile HardwareProfile::ForPrefill() const {
  return WithFactors(*this, has_prefill_factors, prefill_factors);
}

absl::StatusOr<HardwareProfile> HardwareProfile::FromJson(const nlohmann::json& j) {
  if (!j.is_object()) return absl::InvalidArgumentError("profile: expected a JSON object");
  HardwareProfile p;
  auto num = [&](const nlohmann::json& o, const char* key, double* out,
                 const std::string& prefix) -> absl::Status {
    if (!o.contains(key)) {
      return absl::InvalidArgumentError(absl::StrFormat("profile.%s%s is missing", prefix, key));
    }
    if (!o[key].is_number()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("profile.%s%s must be a number", prefix, key));
    }
    *out = o[key].get<double>();
    return absl::OkStatus();
  };
  if (!j.contains("name") || !j["name"].is_string()) {
    return absl::InvalidArgumentError("profile.name must be a string");
  }
  p.name = j["name"].get<std::string>();
  if (j.contains("provenance")) {
    if (!j["provenance"].is_string()) {
      return absl::InvalidArgumentError("profile.provenance must be a string");
    }
    p.provenance = j["provenance"].get<std::string>();
  }
  std::pair<const char*, double*> fields[] = {
      {"peak_flops", &p.peak_flops},
      {"mem_bandwidth", &p.mem_bandwidth},
      {"mem_capacity", &p.mem_capacity},
      {"mem_utilization", &p.mem_utilization},
      {"matmul_efficiency", &p.matmul_efficiency},
      {"attention_efficiency", &p.attention_efficiency},
      {"bandwidth_efficiency", &p.bandwidth_efficiency},
      {"step_overhead", &p.step_overhead},
      {"weight_bytes", &p.weight_bytes},
      {"kv_bytes", &p.kv_bytes},
      {"act_bytes", &p.act_bytes},
      {"tp_bandwidth", &p.tp_bandwidth},
      {"tp_latency", &p.tp_latency},
      {"request_overhead", &p.request_overhead},
      {"token_overhead", &p.token_overhead},
  };
  for (auto& [key, out] : fields) {
    if (absl::Status s = num(j, key, out, ""); !s.ok()) return s;
  }
  // Optional: profiles from before they existed.
  std::pair<const char*, double*> optional_fields[] = {
      {"relay_cpu", &p.relay_cpu},
      {"sample_cpu", &p.sample_cpu},
      {"decode_start_overhead", &p.decode_start_overhead},
      {"request_jitter", &p.request_jitter},
      {"decode_start_jitter", &p.decode_start_jitter},
      {"step_jitter", &p.step_jitter},
      {"host_step_slots", &p.host_step_slots},
      {"host_cores", &p.host_cores},
      {"step_threads", &p.step_threads},
      {"prefill_threads", &p.prefill_threads},
      {"prefill_yield", &p.prefill_yield},
      {"prefill_step_jitter", &p.prefill_step_jitter}};
  for (auto& [key, out] : optional_fields) {
    if (!j.contains(key)) continue;
    if (absl::Status s = num(j, key, out, ""); !s.ok()) return s;
  }
  for (const auto& [role, has, f] : {std::tuple<std::string, bool*, StepFactors*>{
                                         "decode", &p.has_decode_factors, &p.decode_factors},
                                     std::tuple<std::string, bool*, StepFactors*>{
                                         "prefill", &p.has_prefill_factors, &p.prefill_factors}}) {
    if (!j.contains(role)) continue;
    const auto& d = j[role];
    if (!d.is_object()) return absl::InvalidArgumentError("profile." + role + " must be an object");
    *has = true;
    std::pair<const char*, double*> fields[] = {{"matmul_efficiency", &f->matmul_efficiency},
                                                {"attention_efficiency", &f->attention_efficiency},
                                                {"bandwidth_efficiency", &f->bandwidth_efficiency},
                                                {"step_overhead", &f->step_overhead}};
    for (auto& [key, out] : fields) {
      if (absl::Status s = num(d, key, out, role + "."); !s.ok()) return s;
    }
  }
  double max_tp = 0;
  if (absl::Status s = num(j, "max_tp", &max_tp, ""); !s.ok()) return s;
  if (max_tp != std::floor(max_tp))
    return absl::InvalidArgumentError("profile.max_tp must be an integer");
  p.max_tp = static_cast<int>(std::clamp(max_tp, -1.0, 1e6));
  for (const char* key : {"overlap", "shared_host"}) {
    if (!j.contains(key) || !j[key].is_boolean()) {
      return absl::InvalidArgumentError(absl::StrFormat("profile.%s must be true or false", key));
    }
  }
  p.overlap = j["overlap"].get<bool>();
  p.shared_host = j["shared_host"].get<bool>();
  if (!j.contains("kv_link") || !j["kv_link"].is_object()) {
    return absl::InvalidArgumentError("profile.kv_link must be an object");
  }
  const auto& l = j["kv_link"];
  if (!l.contains("name") || !l["name"].is_string()) {
    return absl::InvalidArgumentError("profile.kv_link.name must be a string");
  }
  p.kv_link.name = l["name"].get<std::string>();
  if (absl::Status s = num(l, "bandwidth", &p.kv_link.bandwidth, "kv_link."); !s.ok()) return s;
  if (absl::Status s = num(l, "latency", &p.kv_link.latency, "kv_link."); !s.ok()) return s;
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  return p;
}

std::vector<std::string> BuiltinProfileNames() {
  std::vector<std::string> names;
  for (const auto& [name, json] : kMeasured) names.push_back(name);
  for (const auto& p : Datasheets()) names.push_back(p.name);
  return names;
}

std::string LocalProfilePath() {
  if (const char* env = std::getenv("TANDEM_LOCAL_PROFILE"); env && *env) return env;
  const char* home = std::getenv("HOME");
  return absl::StrFormat("%s/.cache/tandem/local_profile.json", home && *home ? home : "/tmp");
}

absl::StatusOr<HardwareProfile> LoadProfile(const std::string& name_or_path) {
  std::string lower = name_or_path;
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (lower == "h100" || lower == "h100-sxm5") lower = "h100-sxm";
  if (lower == "a100" || lower == "a100-80g") lower = "a100-80gb";
  for (const auto& [name, json] : kMeasured) {
    if (lower != name) continue;
    auto p = HardwareProfile::FromJson(nlohmann::json::parse(json, nullptr, false));
    if (!p.ok()) {
      return absl::InternalError(
          absl::StrFormat("the built-in profile %s: %s", name, std::string(p.status().message())));
    }
    return p;
  }
  for (const auto& p : Datasheets()) {
    if (p.name == lower) return p;
  }
  const bool local = lower == "local";
  const std::string path = local ? LocalProfilePath() : name_or_path;
  std::ifstream in(path);
  if (!in) {
    std::string names;
    for (const auto& n : BuiltinProfileNames()) names += " " + n;
    if (local) {
      return absl::NotFoundError(absl::StrFormat(
          "--hardware local: no calibrated profile at %s; run `tandem plan calibrate --model PATH` "
          "first",
          path));
    }
    return absl::InvalidArgumentError(
        absl::StrFormat("--hardware \"%s\": not a profile (known:%s local) nor a readable file",
                        name_or_path, names));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto j = nlohmann::json::parse(text.str(), nullptr, false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrFormat("%s: not JSON", path));
  auto p = HardwareProfile::FromJson(j);
  if (!p.ok()) {
    return absl::Status(p.status().code(),
                        absl::StrFormat("%s: %s", path, std::string(p.status().message())));
  }
  return p;
}

absl::StatusOr<Link> ParseLink(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  if (parts.size() == 1) {
    Link l = NamedLink(parts[0]);
    if (l.name.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--link \"%s\": expected nvlink, infiniband, roce, tcp, loopback or NAME:GBPS[:LAT_US]",
          spec));
    }
    return l;
  }
  double gbps = 0, lat_us = 10;
  if (parts.size() > 3 || parts[0].empty() || !absl::SimpleAtod(parts[1], &gbps) || !(gbps > 0) ||
      (parts.size() == 3 && (!absl::SimpleAtod(parts[2], &lat_us) || !(lat_us >= 0)))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--link \"%s\": expected NAME:GBPS[:LATENCY_US] with GBPS > 0 (gigabytes/s)", spec));
  }
  return Link{parts[0], gbps * kGB, lat_us * 1e-6};
}

CostModel::CostModel(ModelConfig config, HardwareProfile profile, int tp)
    : config_(std::move(config)), profile_(std::move(profile)), tp_(std::max(1, tp)) {}

namespace {

// The attention's matrix parameters in one layer.
double AttentionParams(const ModelConfig& c) {
  return double(c.dim) * c.q_dim() + 2.0 * c.dim * c.kv_dim() + double(c.q_dim()) * c.dim;
}

// The MLP's matrix parameters per layer, averaged over the layers, counting `experts` experts
// (and the router) of each mixture-of-experts layer; dense layers count whole.
double MlpParams(const ModelConfig& c, double experts) {
  const int moe = c.MoeLayers();
  const double dense = 3.0 * c.dim * c.hidden_dim;
  const double mixture = experts * 3.0 * c.dim * c.expert_hidden_dim + double(c.n_experts) * c.dim;
  return ((c.n_layers - moe) * dense + moe * mixture) / c.n_layers;
}

// The experts whose weights a step of `tokens` tokens reads in one mixture layer, each token
// taking k of the n experts as if at random: n (1 - (1 - k/n)^tokens).
double ExpertsTouched(const ModelConfig& c, double tokens) {
  if (c.n_experts == 0) return 0;
  const double n = c.n_experts, k = c.n_experts_used;
  return n * (1.0 - std::pow(1.0 - k / n, tokens));
}

}  // namespace

double CostModel::MatrixParams() const {
  const ModelConfig& c = config_;
  const double per_layer = AttentionParams(c) + MlpParams(c, c.n_experts);
  return per_layer * c.n_layers + double(c.vocab_size) * c.dim;
}

double CostModel::KvBytesPerToken() const {
  return 2.0 * config_.n_layers * config_.kv_dim() * profile_.kv_bytes;
}

double CostModel::KvCapacityBytes() const {
  const double per_device =
      profile_.mem_capacity * profile_.mem_utilization - WeightBytesPerDevice();
  return per_device * tp_;
}

StepCost CostModel::Step(std::span<const ChunkShape> batch) const {
  const ModelConfig& c = config_;
  const HardwareProfile& p = profile_;
  StepCost s;
  if (batch.empty()) return s;
  // The share of layers that attend within the sliding window (all, none, or Gemma 3's 5 of 6).
  int windowed_layers = 0;
  for (int l = 0; l < c.n_layers; ++l) windowed_layers += c.LayerWindow(l) > 0;
  const double windowed = static_cast<double>(windowed_layers) / c.n_layers;
  double tokens = 0, attended = 0, context_read = 0;  // per layer, averaged over the layers
  double rows = 0;                                    // logit rows: the classifier's tokens
  for (const ChunkShape& ch : batch) {
    const double n = ch.tokens, ctx = ch.context;
    tokens += n;
    rows += std::clamp(ch.logit_rows, 1, ch.tokens);
    // Query j (0-based) of the chunk attends to ctx + j + 1 positions (causal), capped by the
    // sliding window on the windowed layers.
    double in_window = 0;
    if (windowed_layers > 0) {
      for (int j = 0; j < ch.tokens; ++j) {
        in_window += std::min<double>(ctx + j + 1, c.sliding_window);
      }
    }
    attended += windowed * in_window + (1 - windowed) * (n * ctx + n * (n + 1) / 2);
    context_read +=
        windowed * std::min<double>(ctx + n, c.sliding_window > 0 ? c.sliding_window : ctx + n) +
        (1 - windowed) * (ctx + n);
  }
  // Per token, a mixture-of-experts layer computes only its k experts (and the router).
  const double layer_params = AttentionParams(c) + MlpParams(c, c.n_experts_used);
  s.matmul_flops =
      (2.0 * tokens * layer_params * c.n_layers + 2.0 * rows * c.dim * c.vocab_size) / tp_;
  // q·Kᵀ and p·V: 2 FLOPs per multiply-add, head_dim per attended position per query head.
  s.attention_flops = 2.0 * 2.0 * c.n_layers * c.q_dim() * attended / tp_;
  // Every matrix is read once per step, but of a mixture only the experts the step's tokens
  // chose.
  s.weight_bytes = ((AttentionParams(c) + MlpParams(c, ExpertsTouched(c, tokens))) * c.n_layers +
                    double(c.vocab_size) * c.dim) *
                   p.weight_bytes / tp_;
  // Each sequence's cached K/V (and its new tokens') is read once per layer per step.
  s.kv_read_bytes = KvBytesPerToken() * context_read / tp_;
  s.kv_write_bytes = KvBytesPerToken() * tokens / tp_;
  // Per layer and token, each activation is written once and read once: the residual stream
  // (x, normed x, attention out, MLP out), q/k/v, the attention output and the MLP's three
  // hidden-width vectors (of each expert the token takes); then the final norm and the logits.
  const double act_per_token_layer = 4.0 * c.dim + c.q_dim() + 2.0 * c.kv_dim() + c.q_dim() +
                                     MlpParams(c, c.n_experts_used) / c.dim;
  s.activation_bytes = (2.0 * p.act_bytes * tokens * act_per_token_layer * c.n_layers / tp_) +
                       2.0 * p.act_bytes * rows * c.vocab_size / tp_;
  s.compute_seconds = s.matmul_flops / (p.peak_flops * p.matmul_efficiency) +
                      s.attention_flops / (p.peak_flops * p.attention_efficiency);
  s.memory_seconds = s.bytes() / (p.mem_bandwidth * p.bandwidth_efficiency);
  if (tp_ > 1) {
    // Two all-reduces of the [tokens, dim] activations per layer; a ring moves 2 (tp - 1) / tp
    // of the buffer through each device's link.
    const double buffer = tokens * c.dim * p.act_bytes;
    const double per = 2.0 * (tp_ - 1) / tp_ * buffer / p.tp_bandwidth + p.tp_latency;
    s.comm_seconds = 2.0 * c.n_layers * per;
  }
  s.seconds = p.step_overhead + s.comm_seconds +
              (p.overlap ? std::max(s.compute_seconds, s.memory_seconds)
                         : s.compute_seconds + s.memory_seconds);
  return s;
}

double CostModel::TransferDone(double step_start, double compute_seconds, int tokens,
                               const Link& link, double* link_free) const {
  const int layers = config_.n_layers;
  const double per_layer = KvBytesPerToken() / layers * tokens;
  double t = *link_free;
  for (int l = 0; l < layers; ++l) {
    const double ready = step_start + compute_seconds * (l + 1) / layers;
    t = std::max(t, ready) + per_layer / link.bandwidth + link.latency;
  }
  *link_free = t;
  return t;
}

}  // namespace tandem::planner
