// deploy/: every Grafana panel query becomes a recording rule, and promtool checks those and
// deploy/prometheus/rules.yml (syntax and PromQL), runs the rules' unit tests and checks the
// scrape configuration. Every metric, and every histogram bucket bound, that a query or rule
// names must be one Tandem exports (read from a registry holding every role's metrics).
#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "formats/mapped_file.h"
#include "metrics/metrics.h"
#include "tests/metrics/metrics_text.h"
#include "tests/test_util.h"

namespace tandem {
namespace {

constexpr char kPromtool[] = "/usr/bin/promtool";

std::string DeployDir() { return testing::SourceDir() + "/deploy"; }

// Runs `command`; returns its exit status and fills `output` with stdout and stderr.
int RunCommand(const std::string& command, std::string* output) {
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) output->append(buf, n);
  const int status = ::pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Every (panel title, refId, expr) of the dashboard, rows' nested panels included.
struct Query {
  std::string panel;
  std::string ref;
  std::string expr;
};

std::vector<Query> DashboardQueries(const nlohmann::json& dashboard) {
  std::vector<Query> out;
  std::vector<nlohmann::json> panels(dashboard["panels"].begin(), dashboard["panels"].end());
  for (size_t i = 0; i < panels.size(); ++i) {
    const nlohmann::json p = panels[i];  // a copy: the insert below may move panels[i]
    if (p.contains("panels")) panels.insert(panels.end(), p["panels"].begin(), p["panels"].end());
    if (!p.contains("targets")) continue;
    for (const auto& t : p["targets"]) {
      out.push_back({p["title"].get<std::string>(), t["refId"].get<std::string>(),
                     t["expr"].get<std::string>()});
    }
  }
  return out;
}

// The dashboard's variables as a rule can hold them: every model, every job, a 1m window.
absl::StatusOr<std::string> Substitute(std::string expr) {
  const std::vector<std::pair<std::string, std::string>> vars = {
      {"$__rate_interval", "1m"}, {"$model", ".+"}, {"$job", ".+"}};
  for (const auto& [var, value] : vars) {
    for (size_t at; (at = expr.find(var)) != std::string::npos;)
      expr.replace(at, var.size(), value);
  }
  if (expr.find('$') != std::string::npos) {
    return absl::InvalidArgumentError("unknown dashboard variable in: " + expr);
  }
  return expr;
}

// Every series name (with _bucket/_sum/_count) and bucket bound Tandem exports.
struct Exported {
  std::set<std::string> names;
  std::set<std::pair<std::string, std::string>> buckets;  // (name_bucket, le)
};

Exported ExportedMetrics() {
  MetricsRegistry registry("m");
  RouterMetrics router(registry);
  PrefillMetrics prefill(registry);
  DecodeMetrics decode(registry);
  // The per-worker families have series once a worker is known.
  router.worker_healthy("w", "decode");
  router.routing_decisions("w", "decode");
  Exported e;
  for (const auto& s : testing::ParseMetricsText(registry.Serialize())) {
    e.names.insert(s.name);
    if (s.labels.count("le")) e.buckets.insert({s.name, s.labels.at("le")});
  }
  return e;
}

// Checks every tandem_* metric and every le="..." bound that `text` names.
void CheckNames(const std::string& what, const std::string& text, const Exported& exported) {
  static const std::regex kName("\\btandem_[a-z0-9_]+");
  for (std::sregex_iterator it(text.begin(), text.end(), kName), end; it != end; ++it) {
    EXPECT_TRUE(exported.names.count(it->str())) << what << ": no metric " << it->str();
  }
  static const std::regex kBucket("(tandem_[a-z0-9_]+_bucket)\\{[^}]*\\ble=\"([^\"]+)\"");
  for (std::sregex_iterator it(text.begin(), text.end(), kBucket), end; it != end; ++it) {
    EXPECT_TRUE(exported.buckets.count({(*it)[1].str(), (*it)[2].str()}))
        << what << ": " << (*it)[1] << " has no bucket le=\"" << (*it)[2] << "\"";
  }
}

TEST(DeployTest, DashboardQueriesNameExportedMetrics) {
  const nlohmann::json dashboard =
      testing::LoadJson(DeployDir() + "/grafana/tandem-dashboard.json");
  ASSERT_TRUE(dashboard.is_object()) << "tandem-dashboard.json is not JSON";
  const std::vector<Query> queries = DashboardQueries(dashboard);
  ASSERT_GE(queries.size(), 20u);
  const Exported exported = ExportedMetrics();
  ASSERT_GT(exported.names.size(), 40u);
  for (const Query& q : queries) CheckNames(q.panel, q.expr, exported);
  // Every panel that is not a row shows something.
  for (const auto& p : dashboard["panels"]) {
    if (p["type"] != "row") {
      EXPECT_FALSE(p["targets"].empty()) << p["title"];
    }
  }
  auto rules = ReadFileToString(DeployDir() + "/prometheus/rules.yml");
  ASSERT_TRUE(rules.ok()) << rules.status();
  CheckNames("rules.yml", *rules, exported);
}

TEST(DeployTest, PromtoolChecksDashboardQueriesRulesAndConfig) {
  if (!std::filesystem::exists(kPromtool)) {
    GTEST_SKIP() << kPromtool << " is absent (Debian package prometheus, scripts/setup.sh)";
  }
  const nlohmann::json dashboard =
      testing::LoadJson(DeployDir() + "/grafana/tandem-dashboard.json");
  ASSERT_TRUE(dashboard.is_object());
  // One recording rule per panel query; a JSON string is a YAML double-quoted scalar.
  testing::TempDir tmp;
  const std::string rules_path = tmp.path() + "/dashboard_rules.yml";
  {
    std::ofstream out(rules_path);
    out << "groups:\n  - name: tandem-dashboard\n    rules:\n";
    int n = 0;
    for (const Query& q : DashboardQueries(dashboard)) {
      auto expr = Substitute(q.expr);
      ASSERT_TRUE(expr.ok()) << q.panel << ": " << expr.status();
      out << "      - record: dashboard:panel_" << n++ << "_" << q.ref << "\n"
          << "        expr: " << nlohmann::json(*expr).dump() << "\n";
    }
  }
  std::string output;
  EXPECT_EQ(RunCommand(absl::StrFormat("%s check rules %s %s/prometheus/rules.yml", kPromtool,
                                       rules_path, DeployDir()),
                       &output),
            0)
      << output;
  EXPECT_NE(output.find("SUCCESS"), std::string::npos) << output;
  output.clear();
  EXPECT_EQ(RunCommand(absl::StrFormat("%s test rules %s/prometheus/rules_test.yml", kPromtool,
                                       DeployDir()),
                       &output),
            0)
      << output;
  output.clear();
  EXPECT_EQ(RunCommand(absl::StrFormat("%s check config %s/prometheus/prometheus.yml", kPromtool,
                                       DeployDir()),
                       &output),
            0)
      << output;
}

TEST(DeployTest, PromtoolRejectsABrokenQuery) {
  // The check above can fail: a malformed expression does not pass.
  if (!std::filesystem::exists(kPromtool)) GTEST_SKIP() << kPromtool << " is absent";
  testing::TempDir tmp;
  const std::string path = tmp.path() + "/bad.yml";
  std::ofstream(path) << "groups:\n  - name: bad\n    rules:\n      - record: bad:rule\n"
                         "        expr: \"sum(rate(tandem_requests_total[1m])\"\n";
  std::string output;
  EXPECT_NE(RunCommand(absl::StrFormat("%s check rules %s", kPromtool, path), &output), 0)
      << output;
}

TEST(DeployTest, UnknownMetricsAndBucketsAreReported) {
  const Exported exported = ExportedMetrics();
  CheckNames("ok", "rate(tandem_time_to_first_token_seconds_bucket{le=\"1\"}[1m])", exported);
  EXPECT_NONFATAL_FAILURE(CheckNames("typo", "rate(tandem_generation_token_total[1m])", exported),
                          "no metric tandem_generation_token_total");
  EXPECT_NONFATAL_FAILURE(
      CheckNames("bound", "tandem_time_to_first_token_seconds_bucket{le=\"0.3\"}", exported),
      "has no bucket le=\"0.3\"");
}

TEST(DeployTest, UnknownDashboardVariableIsReported) {
  EXPECT_FALSE(Substitute("rate(x{a=\"$cluster\"}[1m])").ok());
  EXPECT_EQ(*Substitute("rate(x{model=~\"$model\"}[$__rate_interval])"),
            "rate(x{model=~\".+\"}[1m])");
}

}  // namespace
}  // namespace tandem
