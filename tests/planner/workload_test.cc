#include "planner/workload.h"

#include <gtest/gtest.h>

#include <cmath>

#include "formats/mapped_file.h"
#include "planner/report_svg.h"
#include "tests/test_util.h"

namespace tandem::bench {
namespace {

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / v.size();
}
double Cv(const std::vector<double>& v) {
  const double m = Mean(v);
  double var = 0;
  for (double x : v) var += (x - m) * (x - m);
  return std::sqrt(var / v.size()) / m;
}

TEST(ArrivalTest, RatesAndBurstiness) {
  const int n = 50000;
  auto gaps = [&](ArrivalProcess::Kind k, double rate, double burst) {
    ArrivalProcess a(k, rate, burst, 42);
    std::vector<double> g(n);
    for (double& x : g) x = a.NextGap();
    return g;
  };
  // Mean gap 1/rate within 3% (standard error of the mean is 1/sqrt(n) = 0.45% for Poisson).
  const auto poisson = gaps(ArrivalProcess::Kind::kPoisson, 4.0, 1.0);
  EXPECT_NEAR(Mean(poisson), 0.25, 0.25 * 0.03);
  EXPECT_NEAR(Cv(poisson), 1.0, 0.03);  // exponential: coefficient of variation 1
  const auto constant = gaps(ArrivalProcess::Kind::kConstant, 4.0, 1.0);
  EXPECT_DOUBLE_EQ(constant[0], 0.25);
  EXPECT_DOUBLE_EQ(Cv(constant), 0.0);
  // Gamma with shape k has CV 1/sqrt(k): burstier below 1, more regular above.
  EXPECT_NEAR(Cv(gaps(ArrivalProcess::Kind::kGamma, 4.0, 0.25)), 2.0, 0.1);
  EXPECT_NEAR(Cv(gaps(ArrivalProcess::Kind::kGamma, 4.0, 4.0)), 0.5, 0.03);
  EXPECT_NEAR(Mean(gaps(ArrivalProcess::Kind::kGamma, 4.0, 0.25)), 0.25, 0.25 * 0.05);
  // Seeded: the same sequence twice.
  EXPECT_EQ(gaps(ArrivalProcess::Kind::kPoisson, 4.0, 1.0), poisson);
}

TEST(LengthTest, Specs) {
  std::mt19937_64 rng(1);
  auto fixed = LengthDistribution::Parse("128");
  ASSERT_TRUE(fixed.ok());
  EXPECT_EQ(fixed->Sample(rng), 128);
  auto uni = LengthDistribution::Parse("uniform:10:20");
  ASSERT_TRUE(uni.ok());
  int lo = 1000, hi = 0;
  for (int i = 0; i < 10000; ++i) {
    const int v = uni->Sample(rng);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  EXPECT_EQ(lo, 10);
  EXPECT_EQ(hi, 20);
  EXPECT_NEAR(uni->Mean(), 15.0, 0.2);
  auto logn = LengthDistribution::Parse("lognormal:200:0.8:max=1000");
  ASSERT_TRUE(logn.ok());
  std::vector<double> v;
  for (int i = 0; i < 20001; ++i) v.push_back(logn->Sample(rng));
  EXPECT_NEAR(Percentile(v, 0.5), 200, 8);  // the median of a log-normal is exp(mu)
  EXPECT_LE(*std::max_element(v.begin(), v.end()), 1000);
  for (const char* bad :
       {"", "0", "-3", "uniform:5", "uniform:9:3", "lognormal:0:1", "zipf:3", "12:max=0", "abc"}) {
    EXPECT_FALSE(LengthDistribution::Parse(bad).ok()) << bad;
  }
}

TEST(StatsTest, PercentilesMatchNumpy) {
  // numpy.percentile([1..10], [50, 90, 99]) = 5.5, 9.1, 9.91
  std::vector<double> v = {10, 9, 8, 7, 6, 5, 4, 3, 2, 1};
  EXPECT_DOUBLE_EQ(Percentile(v, 0.5), 5.5);
  EXPECT_NEAR(Percentile(v, 0.9), 9.1, 1e-12);
  EXPECT_NEAR(Percentile(v, 0.99), 9.91, 1e-12);
  const Percentiles p = Summarize(v);
  EXPECT_DOUBLE_EQ(p.mean, 5.5);
  EXPECT_DOUBLE_EQ(p.max, 10);
  EXPECT_EQ(p.count, 10);
}

RequestRecord Rec(int id, double sent, double first, double done, int out, int status = 0) {
  RequestRecord r;
  r.id = id;
  r.sent = sent;
  r.first_token = first;
  r.done = done;
  r.output_tokens = out;
  r.prompt_tokens = 10;
  r.status_code = status;
  for (int i = 0; i < out; ++i)
    r.token_times.push_back(first + (done - first) * i / std::max(1, out - 1));
  return r;
}

TEST(StatsTest, GoodputAndAccounting) {
  std::vector<RequestRecord> rs = {
      Rec(0, 0.0, 0.1, 1.1, 11),     // TTFT 0.1, TPOT 0.1
      Rec(1, 0.0, 0.5, 1.5, 11),     // TTFT 0.5: misses the TTFT SLO
      Rec(2, 1.0, 1.2, 4.2, 11),     // TPOT 0.3: misses the TPOT SLO
      Rec(3, 1.0, -1, 1.0, 0, 8),    // RESOURCE_EXHAUSTED: rejected
      Rec(4, 1.0, 1.1, 2.0, 3, 14),  // UNAVAILABLE after the first token: failed
      Rec(5, 1.0, -1, 1.5, 0, 4),    // DEADLINE_EXCEEDED: failed
  };
  RequestRecord warm = Rec(6, -5, -4.9, -4, 5);
  warm.warmup = true;
  rs.push_back(warm);
  const BenchSummary s = Summarize(rs, Slo{0.2, 0.2});
  EXPECT_EQ(s.sent, 6);
  EXPECT_EQ(s.completed, 3);
  EXPECT_EQ(s.rejected_total, 1);
  EXPECT_EQ(s.rejected.at("RESOURCE_EXHAUSTED"), 1);
  EXPECT_EQ(s.failed, 2);
  EXPECT_EQ(s.completed + s.rejected_total + s.failed, s.sent);
  EXPECT_DOUBLE_EQ(s.duration, 4.2);
  EXPECT_NEAR(s.goodput, 1 / 4.2, 1e-12);  // only request 0 meets both SLOs
  EXPECT_NEAR(s.slo_attainment, 1.0 / 6, 1e-12);
  EXPECT_EQ(s.output_tokens, 33);
  EXPECT_NEAR(s.ttft.p50, 0.2, 1e-12);  // {0.1, 0.2, 0.5}
  EXPECT_NEAR(s.tpot.max, 0.3, 1e-12);
  EXPECT_EQ(s.itl.count, 30);
}

TEST(TraceTest, ParsesAndRejects) {
  testing::TempDir dir;
  const std::string p = dir.path() + "/t.jsonl";
  ASSERT_TRUE(WriteStringToFile(p,
                                "{\"prompt_tokens\": 5, \"output_tokens\": 7}\n\n"
                                "{\"prompt\": \"hello\", \"output_tokens\": 2}\n")
                  .ok());
  auto t = LoadTrace(p, 512, 1);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[0].prompt.size(), 5u);
  EXPECT_EQ((*t)[0].output_tokens, 7);
  EXPECT_EQ((*t)[1].text, "hello");
  for (const char* bad : {"not json", "{\"prompt_tokens\": 5}", "{\"output_tokens\": 3}",
                          "{\"prompt_tokens\": -1, \"output_tokens\": 3}",
                          "{\"prompt\": \"\", \"output_tokens\": 3}"}) {
    ASSERT_TRUE(WriteStringToFile(p, bad).ok());
    EXPECT_FALSE(LoadTrace(p, 512, 1).ok()) << bad;
  }
  EXPECT_FALSE(LoadTrace(dir.path() + "/missing", 512, 1).ok());
}

TEST(ReportTest, SvgHasOneCurvePerRunAndTheLabels) {
  std::vector<RequestRecord> rs = {Rec(0, 0, 0.1, 1.1, 11), Rec(1, 0, 0.2, 1.2, 11)};
  nlohmann::json run = {{"config", {{"rate", 2.0}}},
                        {"summary", ToJson(Summarize(rs, {}))},
                        {"requests", {ToJson(rs[0]), ToJson(rs[1])}}};
  auto svg = RenderReportSvg({run, run}, {"colocated", "disagg <1p1d>"});
  ASSERT_TRUE(svg.ok());
  EXPECT_EQ(svg->rfind("<svg", 0), 0u);
  size_t polylines = 0;
  for (size_t pos = 0; (pos = svg->find("<polyline", pos)) != std::string::npos; ++pos) ++polylines;
  EXPECT_EQ(polylines, 5u);  // TTFT and TPOT per run, plus throughput vs rate
  EXPECT_NE(svg->find("colocated"), std::string::npos);
  EXPECT_EQ(svg->find("<1p1d>"), std::string::npos);  // escaped
  EXPECT_FALSE(RenderReportSvg({}, {}).ok());
}

}  // namespace
}  // namespace tandem::bench
