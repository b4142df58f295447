// tokenizer_bench: load time and single-core encode throughput of the tokenizer.json
// tokenizers in ../shared/testdata/tokenizers (Qwen3 byte-level BPE, Mistral sentencepiece-style
// BPE). Prints the figures and writes them as JSON.
//
//   tokenizer_bench [--data DIR] [--out FILE] [--mb N] [--only qwen3|mistral]
//
// Two texts of about N MB each (default 16):
//   * "vectors": the reference vectors' texts (19 categories: English, code, Chinese, Japanese,
//     Korean, Arabic, emoji, whitespace, ...) repeated; words recur as in real text, so the
//     BPE word cache is warm;
//   * "unique_words": generated words over Latin, Cyrillic, Greek, CJK, Hangul and Arabic
//     letters with digits and punctuation, almost never repeating: a cold cache, every word runs
//     the merges (a worst case).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/tokenizer_texts.h"
#include "lib/unicode/unicode.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer/hf_tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

using tandem::bench::VectorsText;

std::string UniqueWordsText(size_t target_bytes) {
  static constexpr std::pair<uint32_t, uint32_t> kAlphabets[] = {{'a', 'z'},       {0x430, 0x44F},
                                                                 {0x3B1, 0x3C9},   {0x4E00, 0x9FA5},
                                                                 {0xAC00, 0xD7A3}, {0x627, 0x64A}};
  std::mt19937 rng(7);
  std::uniform_int_distribution<size_t> alphabet(0, std::size(kAlphabets) - 1);
  std::uniform_int_distribution<int> word_len(1, 9), r100(0, 99);
  std::string text;
  while (text.size() < target_bytes) {
    const auto [lo, hi] = kAlphabets[alphabet(rng)];
    std::uniform_int_distribution<uint32_t> letter(lo, hi);
    const int n = lo > 0x2000 ? 1 + word_len(rng) / 3 : word_len(rng);
    for (int i = 0; i < n; ++i) tandem::unicode::AppendUtf8(letter(rng), &text);
    const int r = r100(rng);
    if (r < 8) {
      text += std::to_string(rng() % 100000);
    } else if (r < 16) {
      text += ", ";
    } else if (r < 20) {
      text += ".\n";
    } else {
      text += ' ';
    }
  }
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string data_dir = std::string(TANDEM_SHARED_DIR) + "/testdata/tokenizers";
  std::string out_path = std::string(TANDEM_BENCH_RESULTS_DIR) + "/tokenizer_bench.json";
  double mb = 16;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--data")) {
      data_dir = argv[i + 1];
    } else if (!std::strcmp(argv[i], "--out")) {
      out_path = argv[i + 1];
    } else if (!std::strcmp(argv[i], "--mb")) {
      mb = std::atof(argv[i + 1]);
    } else if (!std::strcmp(argv[i], "--only")) {
      only = argv[i + 1];
    } else {
      std::fprintf(stderr, "usage: %s [--data DIR] [--out FILE] [--mb N] [--only NAME]\n", argv[0]);
      return 2;
    }
  }
  const size_t target = static_cast<size_t>(mb * 1e6);
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"vectors", VectorsText(data_dir, target)}, {"unique_words", UniqueWordsText(target)}};

  nlohmann::json results = {{"unicode_version", tandem::unicode::UnicodeVersion()},
                            {"tokenizers", nlohmann::json::array()}};
  for (const char* name : {"qwen3", "mistral"}) {
    if (!only.empty() && only != name) continue;
    const std::string path = data_dir + "/" + name + ".tokenizer.json";
    // Load time: best of 3 (the first run also pays for reading the file from disk).
    double best_load = 1e9;
    std::unique_ptr<tandem::HfTokenizer> tok;
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = Clock::now();
      auto loaded = tandem::HfTokenizer::Load(path);
      const auto t1 = Clock::now();
      if (!loaded.ok()) {
        std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
        return 1;
      }
      best_load = std::min(best_load, Seconds(t0, t1));
      tok = *std::move(loaded);
    }
    std::printf("%-8s load %7.1f ms  (vocab %d)\n", name, best_load * 1e3, tok->vocab_size());
    nlohmann::json entry = {{"name", name},
                            {"load_ms", best_load * 1e3},
                            {"vocab_size", tok->vocab_size()},
                            {"corpora", nlohmann::json::array()}};
    for (const auto& [corpus, text] : texts) {
      // Encoded in 64 KB chunks, as requests would arrive, on one thread.
      const size_t kChunk = 1 << 16;
      size_t tokens = 0;
      const auto t0 = Clock::now();
      for (size_t pos = 0; pos < text.size();) {
        size_t end = std::min(text.size(), pos + kChunk);
        while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
        tokens += tok->Encode(std::string_view(text).substr(pos, end - pos), false).size();
        pos = end;
      }
      const double secs = Seconds(t0, Clock::now());
      const double mbps = text.size() / secs / 1e6;
      std::printf(
          "%-8s encode %-12s %6.1f MB  %9zu tokens  %6.2f s  %6.1f MB/s  %5.2f bytes/token\n", name,
          corpus.c_str(), text.size() / 1e6, tokens, secs, mbps,
          static_cast<double>(text.size()) / tokens);
      entry["corpora"].push_back({{"name", corpus},
                                  {"bytes", text.size()},
                                  {"tokens", tokens},
                                  {"seconds", secs},
                                  {"mb_per_s", mbps}});
    }
    results["tokenizers"].push_back(entry);
  }
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(out_path).parent_path(), ec);
  std::ofstream out(out_path);
  out << results.dump(2) << "\n";
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
    return 1;
  }
  std::printf("wrote %s\n", out_path.c_str());
  return 0;
}
