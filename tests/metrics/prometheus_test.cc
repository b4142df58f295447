// A real Prometheus (the Debian package) on loopback, with its own port and data directory,
// scraping a local cluster every second and evaluating deploy/prometheus/rules.yml: after two
// rounds of requests its query API returns the counts the clients saw, a histogram_quantile
// consistent with the TTFTs the clients measured, and every rule evaluates without error.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "metrics/metrics.h"
#include "tests/metrics/metrics_text.h"
#include "tests/serving/cluster.h"
#include "tools/server_process.h"

namespace tandem {
namespace {

constexpr char kPrometheus[] = "/usr/bin/prometheus";

// A free loopback port (bound and released; Prometheus takes it right after).
int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

std::string UrlEncode(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// The Prometheus server, stopped (SIGTERM, then SIGKILL) when the object dies.
class PrometheusServer {
 public:
  PrometheusServer(const std::string& config, const std::string& data_dir, const std::string& log)
      : address_(absl::StrFormat("127.0.0.1:%d", FreePort())), log_(log) {
    pid_ = ::fork();
    if (pid_ == 0) {
      FILE* f = std::fopen(log.c_str(), "w");
      if (f) {
        ::dup2(::fileno(f), 1);
        ::dup2(::fileno(f), 2);
      }
      const std::vector<std::string> args = {
          kPrometheus, "--config.file=" + config, "--storage.tsdb.path=" + data_dir,
          "--web.listen-address=" + address_, "--log.level=warn"};
      std::vector<char*> argv;
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
  }
  ~PrometheusServer() {
    if (pid_ > 0) StopProcesses({pid_});
  }

  // Waits (bounded) for /-/ready.
  bool WaitReady() {
    for (int i = 0; i < 300; ++i) {
      if (testing::HttpGet(address_, "/-/ready", 1000).ok()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  // The query API's answer, parsed; a JSON null when it cannot be had.
  nlohmann::json Get(const std::string& path) {
    auto body = testing::HttpGet(address_, path);
    if (!body.ok()) return nullptr;
    return nlohmann::json::parse(*body, nullptr, false);
  }

  // An instant query whose result is one sample: its value (NaN included), else nullopt.
  std::optional<double> Query(const std::string& expr) {
    const nlohmann::json r = Get("/api/v1/query?query=" + UrlEncode(expr));
    if (!r.is_object() || r.value("status", "") != "success") return std::nullopt;
    const auto& result = r["data"]["result"];
    if (!result.is_array() || result.size() != 1) return std::nullopt;
    return std::stod(result[0]["value"][1].get<std::string>());
  }

  // Polls `expr` (bounded) until it equals `want`; returns the last value seen.
  std::optional<double> WaitFor(const std::string& expr, double want, int timeout_ms = 30000) {
    std::optional<double> v;
    for (int waited = 0; waited < timeout_ms; waited += 200) {
      v = Query(expr);
      if (v && *v == want) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return v;
  }

  std::string Log() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  std::string address_;
  std::string log_;
  pid_t pid_ = -1;
};

struct Round {
  int ok = 0;
  int tokens = 0;
  int prompt_tokens = 0;
  double max_ttft = 0;  // seconds, measured by the client (>= the router's own)
};

// `n` greedy requests of 6..(5+n) tokens, concurrently; adds what the clients saw to `round`.
void SendRound(v1::Generation::Stub* stub, int n, Round* round) {
  std::vector<std::thread> threads;
  std::mutex mu;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      v1::GenerateRequest r;
      r.set_text(i % 2 ? "Once upon a time" : "The little dog ran to the park");
      r.set_max_tokens(6 + i);
      r.set_ignore_eos(true);
      r.mutable_sampling()->set_temperature(0);
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
      const auto t0 = std::chrono::steady_clock::now();
      auto reader = stub->Generate(&ctx, r);
      v1::GenerateResponse resp;
      int tokens = 0, prompt_tokens = 0;
      double ttft = 0;
      while (reader->Read(&resp)) {
        if (tokens == 0) {
          ttft = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        }
        tokens += resp.token_ids_size();
        if (resp.has_usage()) prompt_tokens = resp.usage().prompt_tokens();
      }
      if (!reader->Finish().ok()) return;
      std::lock_guard<std::mutex> lock(mu);
      ++round->ok;
      round->tokens += tokens;
      round->prompt_tokens += prompt_tokens;
      round->max_ttft = std::max(round->max_ttft, ttft);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(PrometheusTest, ScrapesTheClusterAndAnswersQueries) {
  if (!std::filesystem::exists(kPrometheus)) {
    GTEST_SKIP() << kPrometheus << " is absent: install the Debian package prometheus "
                 << "(scripts/setup.sh) to run this test";
  }
  testing::Cluster c(1, 1);
  ASSERT_TRUE(c.ready());
  ASSERT_EQ(c.metrics().size(), 3u);

  // The scrape configuration: the cluster's three /metrics, every second, through file_sd as
  // in deploy/prometheus/prometheus.yml, with the deployed rules.
  testing::TempDir tmp;
  nlohmann::json targets = nlohmann::json::array();
  const char* roles[] = {"router", "prefill", "decode"};
  for (size_t i = 0; i < 3; ++i) {
    targets.push_back({{"targets", {c.metrics()[i]}}, {"labels", {{"tandem_process", roles[i]}}}});
  }
  std::ofstream(tmp.path() + "/targets.json") << targets.dump();
  std::ofstream(tmp.path() + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
      << "rule_files:\n  - " << testing::SourceDir() << "/deploy/prometheus/rules.yml\n"
      << "scrape_configs:\n  - job_name: tandem\n    file_sd_configs:\n"
      << "      - files: [" << tmp.path() << "/targets.json]\n";
  PrometheusServer prom(tmp.path() + "/prometheus.yml", tmp.path() + "/data",
                        tmp.path() + "/prometheus.log");
  ASSERT_TRUE(prom.WaitReady()) << prom.Log();
  EXPECT_EQ(prom.WaitFor("sum(up{job=\"tandem\"})", 3), 3) << prom.Log();

  // Two rounds, each seen by Prometheus before the next, so rate() has an increase to see.
  Round round;
  SendRound(c.generation(), 4, &round);
  ASSERT_EQ(round.ok, 4);
  EXPECT_EQ(prom.WaitFor("sum(tandem_requests_total{status=\"OK\"})", 4), 4);
  SendRound(c.generation(), 4, &round);
  ASSERT_EQ(round.ok, 8);
  ASSERT_TRUE(c.AllBlocksFree());
  EXPECT_EQ(prom.WaitFor("sum(tandem_requests_total{status=\"OK\"})", 8), 8);

  // Counters, through Prometheus, equal what the clients saw.
  EXPECT_EQ(prom.WaitFor("sum(tandem_generation_tokens_total{role=\"router\"})", round.tokens),
            round.tokens);
  EXPECT_EQ(prom.WaitFor("sum(tandem_prompt_tokens_total{role=\"prefill\"})", round.prompt_tokens),
            round.prompt_tokens);
  EXPECT_EQ(prom.WaitFor("sum(tandem_request_success_total{finished_reason=\"length\"})", 8), 8);
  EXPECT_EQ(prom.WaitFor("sum(tandem_time_to_first_token_seconds_count)", 8), 8);
  EXPECT_EQ(prom.WaitFor("sum(tandem_kv_transfer_bytes_total{role=\"prefill\"}) - "
                         "sum(tandem_kv_transfer_bytes_total{role=\"decode\"})",
                         0),
            0);
  EXPECT_EQ(prom.WaitFor("sum(tandem_worker_healthy)", 2), 2);
  EXPECT_EQ(prom.WaitFor("sum(tandem_kv_cache_usage_perc)", 0), 0);

  // The median TTFT from the histogram lies in (0, the bucket bound above the slowest TTFT a
  // client measured]: interpolation stays inside the bucket that holds the median.
  const std::vector<double>& bounds = RequestLatencyBuckets();
  const auto above = std::lower_bound(bounds.begin(), bounds.end(), round.max_ttft);
  ASSERT_NE(above, bounds.end());
  auto p50 = prom.Query(
      "histogram_quantile(0.5, sum by (le) (tandem_time_to_first_token_seconds_bucket))");
  ASSERT_TRUE(p50.has_value());
  EXPECT_GT(*p50, 0);
  EXPECT_LE(*p50, *above) << "client max TTFT " << round.max_ttft;
  // Over a window, as the dashboard asks it: round two increased the buckets.
  auto p99 = prom.Query(
      "histogram_quantile(0.99, sum by (le) "
      "(rate(tandem_e2e_request_latency_seconds_bucket{role=\"router\"}[1m])))");
  ASSERT_TRUE(p99.has_value());
  EXPECT_TRUE(std::isfinite(*p99));
  EXPECT_GT(*p99, 0);

  // The deployed recording rules produce values; every rule evaluates without an error.
  std::optional<double> tokens_rate;
  for (int i = 0; i < 100 && !(tokens_rate && *tokens_rate > 0); ++i) {
    tokens_rate = prom.Query("tandem:generation_tokens:rate5m");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(tokens_rate.has_value());
  EXPECT_GT(*tokens_rate, 0);
  const auto attainment = prom.Query("tandem:slo_ttft_attainment:ratio_rate5m");
  ASSERT_TRUE(attainment.has_value());
  EXPECT_GE(*attainment, 0);
  EXPECT_LE(*attainment, 1);
  const nlohmann::json rules = prom.Get("/api/v1/rules");
  ASSERT_TRUE(rules.is_object());
  int evaluated = 0;
  for (const auto& group : rules["data"]["groups"]) {
    for (const auto& rule : group["rules"]) {
      EXPECT_NE(rule.value("health", ""), "err")
          << rule.value("name", "") << ": " << rule.value("lastError", "");
      evaluated += rule.value("health", "") == "ok";
    }
  }
  EXPECT_GE(evaluated, 20);
}

}  // namespace
}  // namespace tandem
