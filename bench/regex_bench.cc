// regex_bench: Tandem's tokenizer regex engine (lib/regex/regex.h) against Oniguruma, the
// engine Hugging Face tokenizers runs split patterns with, on the pre-tokenizer patterns of
// GPT-2, Llama 3 and Qwen. For each pattern: whether the two find the same matches on the
// whole text, and single-core throughput (best of several passes). Prints the figures and
// writes them as JSON.
//
//   regex_bench [--data DIR] [--out FILE] [--mb N] [--passes P]
//
// The text is the tokenizer reference vectors' texts (English, code, CJK, Arabic, emoji,
// whitespace runs, ...) repeated to about N MB (default 8).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/tokenizer_texts.h"
#include "lib/regex/regex.h"
#include "nlohmann/json.hpp"
#include "tests/text/tokenizer/onig_reference.h"

namespace {

using Clock = std::chrono::steady_clock;

using tandem::bench::VectorsText;

template <typename F>
double BestSeconds(int passes, F&& f) {
  double best = 1e30;
  for (int i = 0; i < passes; ++i) {
    const auto t0 = Clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data = std::string(TANDEM_SHARED_DIR) + "/testdata/tokenizers";
  std::string out_path = std::string(TANDEM_BENCH_RESULTS_DIR) + "/regex_bench.json";
  double mb = 8;
  int passes = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--data")
      data = argv[i + 1];
    else if (a == "--out")
      out_path = argv[i + 1];
    else if (a == "--mb")
      mb = std::atof(argv[i + 1]);
    else if (a == "--passes")
      passes = std::max(1, std::atoi(argv[i + 1]));
  }
  const std::string text = VectorsText(data, static_cast<size_t>(mb * (1 << 20)));
  const std::vector<std::pair<std::string, std::string>> patterns = {
      {"gpt2", R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
      {"llama3",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {"qwen3",
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
  };
  nlohmann::json results = nlohmann::json::array();
  std::printf("%-8s %10s %12s %12s %8s %s\n", "pattern", "matches", "tandem MB/s", "onig MB/s",
              "ratio", "same");
  for (const auto& [name, pattern] : patterns) {
    auto ours = tandem::Regex::Compile(pattern);
    tandem::testing::OnigReference onig(pattern);
    if (!ours.ok() || !onig.ok()) {
      std::fprintf(stderr, "%s: does not compile\n", name.c_str());
      return 1;
    }
    std::vector<tandem::Regex::Match> a, b;
    const double ta = BestSeconds(passes, [&] {
      a.clear();
      (*ours)->FindAll(text, &a);
    });
    const double tb = BestSeconds(passes, [&] {
      b.clear();
      onig.FindAll(text, &b);
    });
    bool same = a.size() == b.size();
    for (size_t i = 0; same && i < a.size(); ++i) {
      same = a[i].begin == b[i].begin && a[i].end == b[i].end;
    }
    const double mbs = text.size() / double(1 << 20);
    std::printf("%-8s %10zu %12.1f %12.1f %8.2f %s\n", name.c_str(), a.size(), mbs / ta, mbs / tb,
                tb / ta, same ? "yes" : "NO");
    results.push_back({{"pattern", name},
                       {"matches", a.size()},
                       {"tandem_mb_per_s", mbs / ta},
                       {"onig_mb_per_s", mbs / tb},
                       {"tandem_over_onig", tb / ta},
                       {"same_matches", same}});
  }
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%F", std::gmtime(&now));
  nlohmann::json j = {{"date", date},
                      {"command", "build/bin/regex_bench --mb " + std::to_string(mb)},
                      {"oniguruma", std::to_string(ONIGURUMA_VERSION_MAJOR) + "." +
                                        std::to_string(ONIGURUMA_VERSION_MINOR) + "." +
                                        std::to_string(ONIGURUMA_VERSION_TEENY)},
                      {"text_bytes", text.size()},
                      {"passes", passes},
                      {"patterns", results}};
  std::ofstream(out_path) << j.dump(2) << "\n";
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
