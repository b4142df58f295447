// tandem-server's configuration: one struct per role, each flag's default written once (here),
// parsed from the command line by ParseServerFlags (CLI11) and checked by Validate().
#ifndef TANDEM_SERVER_SERVER_CONFIG_H_
#define TANDEM_SERVER_SERVER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

// Every process.
struct CommonConfig {
  std::string role = "all";  // router | prefill | decode | all
  std::string model;
  std::string tokenizer;  // empty: the one beside the model
  std::string host = "127.0.0.1";
  int64_t port = 0;  // router: the public gRPC API; workers: their internal port
  std::string device = "auto";
  std::string cluster_secret_file;
  int64_t metrics_port = 0;
  std::string tls_cert, tls_key, tls_ca;
  int64_t max_message_bytes = 16 << 20;
  std::string advertise_host;  // empty: $TANDEM_ADVERTISE_HOST, else --host
  int64_t keepalive_ms = 10000;
  int64_t max_threads = 0;  // 0: 2048
  int64_t drain_timeout_ms = 30000;
  int64_t cpu_nice = 0;   // the process's CPU niceness, 0..19 (tandem up: 10 for prefill workers)
  bool cpu_idle = false;  // every thread at SCHED_IDLE: CPU only when nothing else wants it

  absl::Status Validate() const;
};

// --role=router (and all).
struct RouterConfig {
  int64_t internal_port = 0;
  int64_t heartbeat_ms = 500;
  int64_t forget_after_ms = 30000;
  std::string api_keys_file;
  int64_t max_inflight = 16384;
  int64_t max_queued = 16384;
  int64_t queue_timeout_ms = 10000;
  int64_t max_resumes = 3;
  int64_t prefill_timeout_ms = 30000;
  int64_t ejection_ms = 5000;
  int64_t http_port = 0;
  int64_t http_threads = 8;
  int64_t event_threads = 2;
  int64_t http_timeout_ms = 0;                              // 0: no deadline
  int64_t http_max_buffered_bytes = int64_t{128} << 20;     // HttpServerOptions::max_buffered_bytes
  int64_t http_max_connections = 16384;                     // HttpServerOptions::max_connections
  int64_t http_max_connections_per_client = 16384;          // ... max_connections_per_client
  int64_t http_response_buffer_bytes = int64_t{256} << 10;  // ... response_buffer_bytes
  int64_t http_min_write_rate = 4096;                       // ... min_write_rate
  int64_t http_max_building_bytes = int64_t{512} << 20;     // ... max_building_bytes
  int64_t http_max_queued = 16384;                          // ... max_queued
  std::string trusted_proxies;                              // ... trusted_proxies
  std::string chat_template;
  std::string served_model_name;  // empty: the model's file or folder name
  bool http_metrics = true;

  absl::Status Validate() const;
};

// --role=prefill and decode (and all).
struct WorkerConfig {
  std::string router;  // HOST:PORT of the router's internal port
  std::string worker_id;
  int64_t block_size = 16;
  int64_t num_blocks = 0;  // 0: from kv_bytes
  // 0: decode workers take kv_memory_fraction of their memory less the weights; prefill
  // workers 1 GiB (prompts in flight and the prefix cache).
  int64_t kv_bytes = 0;
  double kv_memory_fraction = 0.5;
  std::string dtype;  // empty: as stored
  std::string kv_dtype = "auto";
  std::string kv_transport;  // empty: local under --role=all, else tcp
  int64_t nccl_device = 0;
  int64_t wedge_timeout_ms = 10000;
  std::string fault;

  absl::Status Validate() const;
};

struct PrefillConfig {
  int64_t token_budget = 2048;
  int64_t prefill_chunk = 512;
  bool no_prefix_cache = false;
  // --role=all on the CPU: a prefill's window between two decode steps, in decode steps
  // (kernels/cpu/core_share.h); 0: the two engines' loops interleave unmanaged.
  double colocated_prefill_share = 0.75;
};

struct DecodeConfig {
  std::string kv_listen;  // empty: host:0 (tcp), decode-PID (local)
  int64_t max_running = 256;
  int64_t lease_timeout_ms = 60000;
  std::string kv_admission = "on-demand";
  double kv_watermark = 0.01;
  std::string speculative = "off";  // off | ngram | draft
  int64_t spec_tokens = 4;
  std::string draft_model;  // --speculative=draft: a model of the same tokenizer

  absl::Status Validate() const;
};

struct ServerConfig {
  CommonConfig common;
  RouterConfig router;
  WorkerConfig worker;
  PrefillConfig prefill;
  DecodeConfig decode;

  bool is_router() const { return common.role == "router" || common.role == "all"; }
  bool is_prefill() const { return common.role == "prefill" || common.role == "all"; }
  bool is_decode() const { return common.role == "decode" || common.role == "all"; }
  // A separate worker process (not the colocated --role=all).
  bool is_worker_process() const { return common.role == "prefill" || common.role == "decode"; }
  // --kv-transport with its per-role default applied.
  std::string kv_transport() const;

  // Every part, then what crosses parts; messages name the flag.
  absl::Status Validate() const;
};

// What the command line asked for: a configuration to run, or text to print and an exit code
// (--help, --version, or a parse error on stderr with code 2).
struct ServerCommandLine {
  ServerConfig config;
  bool exit = false;
  int exit_code = 0;
};

// Parses argv (argv[0] is the program). `fixed_role` (tandem-router, tandem-prefill,
// tandem-decode) overrides --role. Validates the result.
ServerCommandLine ParseServerFlags(int argc, char** argv, const char* fixed_role);

}  // namespace tandem

#endif  // TANDEM_SERVER_SERVER_CONFIG_H_
