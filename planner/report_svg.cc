#include "planner/report_svg.h"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tandem::bench {

absl::StatusOr<std::string> RenderReportSvg(const std::vector<nlohmann::json>& runs,
                                            const std::vector<std::string>& labels) {
  if (runs.empty()) return absl::InvalidArgumentError("report: no runs");
  static const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e",
                                  "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  const int W = 1300, H = 420, panel_w = 360, panel_h = 300, top = 50, left0 = 60, gap = 70;
  std::ostringstream svg;
  svg << absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
      "font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
      W, H + 30 * static_cast<int>((runs.size() + 3) / 4));
  // Per-request latencies of each run, in ms.
  auto latencies = [](const nlohmann::json& run, const char* what) {
    std::vector<double> v;
    if (!run.contains("requests")) return v;
    for (const auto& r : run["requests"]) {
      if (r.value("warmup", false) || r.value("status", "") != "OK") continue;
      const double sent = r.value("sent", 0.0), first = r.value("first_token", -1.0),
                   done = r.value("done", 0.0);
      const int out = r.value("output_tokens", 0);
      if (std::string(what) == "ttft" && first >= 0) v.push_back((first - sent) * 1e3);
      if (std::string(what) == "tpot" && first >= 0 && out >= 2) {
        v.push_back((done - first) / (out - 1) * 1e3);
      }
    }
    std::sort(v.begin(), v.end());
    return v;
  };
  auto panel = [&](int index, const char* title, const char* xlabel,
                   const std::vector<std::vector<std::pair<double, double>>>& series, bool cdf) {
    const int x0 = left0 + index * (panel_w + gap), y0 = top;
    double xmax = 0, ymax = cdf ? 1.0 : 0;
    for (const auto& s : series) {
      for (const auto& [x, y] : s) {
        xmax = std::max(xmax, x);
        ymax = std::max(ymax, y);
      }
    }
    if (xmax <= 0) xmax = 1;
    if (ymax <= 0) ymax = 1;
    svg << absl::StrFormat(
        "<text x=\"%d\" y=\"%d\" font-weight=\"bold\">%s</text>\n"
        "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n",
        x0, y0 - 10, title, x0, y0, panel_w, panel_h);
    for (int t = 0; t <= 4; ++t) {
      const double fx = xmax * t / 4, fy = ymax * t / 4;
      svg << absl::StrFormat(
          "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#444\">%.3g</text>\n"
          "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"#444\">%.3g</text>\n",
          x0 + panel_w * t / 4, y0 + panel_h + 15, fx, x0 - 4, y0 + panel_h - panel_h * t / 4 + 4,
          fy);
    }
    svg << absl::StrFormat("<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n",
                           x0 + panel_w / 2, y0 + panel_h + 32, xlabel);
    for (size_t i = 0; i < series.size(); ++i) {
      if (series[i].empty()) continue;
      std::string pts;
      for (const auto& [x, y] : series[i]) {
        pts += absl::StrFormat("%.1f,%.1f ", x0 + panel_w * x / xmax,
                               y0 + panel_h - panel_h * y / ymax);
      }
      svg << absl::StrFormat(
          "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"%s\"/>\n",
          kColors[i % 8], pts);
      if (!cdf) {  // scatter points: a run is one point
        for (const auto& [x, y] : series[i]) {
          svg << absl::StrFormat("<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\"/>\n",
                                 x0 + panel_w * x / xmax, y0 + panel_h - panel_h * y / ymax,
                                 kColors[i % 8]);
        }
      }
    }
  };
  for (const char* what : {"ttft", "tpot"}) {
    std::vector<std::vector<std::pair<double, double>>> series;
    for (const auto& run : runs) {
      auto v = latencies(run, what);
      std::vector<std::pair<double, double>> s;
      for (size_t k = 0; k < v.size(); ++k) s.emplace_back(v[k], (k + 1.0) / v.size());
      series.push_back(std::move(s));
    }
    panel(std::string(what) == "ttft" ? 0 : 1,
          std::string(what) == "ttft" ? "TTFT CDF" : "TPOT CDF",
          std::string(what) == "ttft" ? "time to first token (ms)" : "time per output token (ms)",
          series, true);
  }
  // Throughput against offered rate: one point per run, runs with the same label joined.
  std::vector<std::vector<std::pair<double, double>>> tput(1);
  for (const auto& run : runs) {
    const double rate = run.contains("config") ? run["config"].value("rate", 0.0) : 0.0;
    const double t =
        run.contains("summary") ? run["summary"].value("output_token_throughput", 0.0) : 0.0;
    if (rate > 0) tput[0].emplace_back(rate, t);
  }
  std::sort(tput[0].begin(), tput[0].end());
  panel(2, "Output tokens/s vs request rate", "offered rate (req/s)", tput, false);
  for (size_t i = 0; i < runs.size(); ++i) {
    const int x = left0 + static_cast<int>(i % 4) * 280, y = H + 10 + static_cast<int>(i / 4) * 24;
    std::string label = i < labels.size() ? labels[i] : absl::StrFormat("run %d", i + 1);
    for (char& c : label) {
      if (c == '<' || c == '>' || c == '&') c = '_';
    }
    svg << absl::StrFormat(
        "<rect x=\"%d\" y=\"%d\" width=\"14\" height=\"4\" fill=\"%s\"/><text x=\"%d\" "
        "y=\"%d\">%s</text>\n",
        x, y - 4, kColors[i % 8], x + 20, y, label);
  }
  svg << "</svg>\n";
  return svg.str();
}

}  // namespace tandem::bench
