// `tandem`: the command-line tool. Subcommands:
//   generate   run a model on a prompt and stream the completion
//   score      per-token log-probabilities and perplexity of a text
//   tokenize   text on stdin -> JSON array of ids
//   detokenize JSON array of ids on stdin -> text
//   model convert | model random   write Hugging Face model directories
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/generator.h"
#include "engine/kv/kv_cache.h"
#include "engine/loaders/model_writer.h"
#include "engine/model.h"
#include "engine/model_runner.h"
#include "engine/sampling/output_constraint.h"
#include "formats/gguf.h"
#include "kernels/backend_loader.h"
#include "kernels/quant.h"
#include "nlohmann/json.hpp"
#include "planner/report_svg.h"
#include "structured/json_schema.h"
#include "text/load_tokenizer.h"
#include "text/tokenizer/hf_tokenizer.h"
#include "tools/bench_flags.h"
#include "tools/bench_runner.h"
#include "tools/flags.h"
#include "tools/plan_cli.h"
#include "tools/remote.h"

namespace tandem {
namespace {

constexpr char kUsage[] = R"(usage: tandem <command> [flags]

commands:
  generate     run a model on a prompt (here, or through a router) and stream the completion
  score        per-token log-probabilities and perplexity of a text
  tokenize     text on stdin -> JSON array of token ids
  detokenize   JSON array of token ids on stdin -> text
  up           a local cluster: a router, prefill and decode workers
  bench        load generator against a router; bench report compares runs
  plan         capacity planning: prefill/decode layouts ranked by goodput per GPU
  model        model convert | model random: write Hugging Face model directories

`tandem COMMAND --help` gives a command's flags and their defaults.

PATH is a Hugging Face model directory, a GGUF file (.gguf: its tokenizer and
chat template come with it) or a llama2.c checkpoint (.bin); a tokenizer is a
tokenizer.json (or a directory holding one), a GGUF file or a llama2.c
tokenizer.bin.
)";

constexpr char kPathHelp[] =
    "PATH is a Hugging Face model directory, a GGUF file (.gguf: its tokenizer and chat template "
    "come with it) or a llama2.c checkpoint (.bin); a tokenizer is a tokenizer.json (or a "
    "directory holding one), a GGUF file or a llama2.c tokenizer.bin.";

// The flags every command that loads a model takes.
std::vector<FlagSpec> ModelFlags() {
  return {ValueFlag("model", "PATH", "", "The model (required)"),
          ValueFlag("tokenizer", "PATH", "", "The tokenizer (default: the model's)"),
          ValueFlag("device", "auto|cpu|cuda", "auto",
                    "Where the forward pass runs (auto: the GPU when one is usable)"),
          ValueFlag("dtype", "DTYPE", "",
                    "The weights, converted at load when stored otherwise: f32, bf16, f16, q8_0, "
                    "q4_0, q4_1, q5_0, q5_1, q4_k, q5_k, q6_k (default: as stored)"),
          ValueFlag("kv-dtype", "auto|f32|bf16|f16|fp8", "auto",
                    "The KV cache (auto: bf16 with --device=cuda where the model's head_dim has "
                    "FlashInfer attention, else f32)")};
}

// --tls-ca/--tls-cert/--tls-key and --api-key of a router client.
std::vector<FlagSpec> ClientFlags() {
  return {ValueFlag("tls-ca", "PEM", "", "TLS to the router, trusting this CA"),
          ValueFlag("tls-cert", "PEM", "", "Client certificate (mutual TLS)"),
          ValueFlag("tls-key", "PEM", "", "Key of --tls-cert"),
          ValueFlag("api-key", "KEY", "", "The router's API key (default: $TANDEM_API_KEY)")};
}

Flags::Command GenerateCommand() {
  std::vector<FlagSpec> flags = Concat(
      ModelFlags(),
      {
          ValueFlag("prompt", "TEXT", "", "The prompt (required)"),
          ValueFlag("max-tokens", "N", "256", "Most tokens generated"),
          ValueFlag("temperature", "T", "1", "Sampling temperature (0: greedy)"),
          ValueFlag("top-k", "K", "0", "Sample among the K most likely tokens (0: all)"),
          ValueFlag("top-p", "P", "1", "Nucleus sampling: the smallest set of tokens of mass P"),
          ValueFlag("seed", "S", "0", "Sampling seed"),
          RepeatedFlag("stop", "TEXT", "Stop before this text (repeatable)"),
          ValueFlag("presence-penalty", "X", "0", "Penalty on tokens already generated"),
          ValueFlag("frequency-penalty", "X", "0", "Penalty per time a token was generated"),
          ValueFlag("repetition-penalty", "X", "1", "Divides the logits of tokens already seen"),
          ValueFlag("min-tokens", "N", "0", "EOS and stop texts are ignored until N tokens"),
          BoolFlag("ignore-eos", "Generate past the end-of-sequence token"),
          ValueFlag("block-size", "N", "16", "KV cache block size (tokens)"),
          ValueFlag("prefill-chunk", "N", "0",
                    "Prompt tokens computed per step (0: the whole prompt at once)"),
          BoolFlag("json-object", "The output is one JSON object"),
          ValueFlag("json-schema", "SCHEMA|@FILE", "",
                    "The output is one JSON value valid against the schema (JSON text, or @FILE to "
                    "read it from FILE)"),
          ValueFlag(
              "speculative", "off|ngram|draft", "",
              "Each step proposes up to --spec-tokens tokens, by prompt lookup (ngram) or by "
              "a small draft model of the same tokenizer decoding greedily (draft, "
              "--draft-model), and scores them in one forward pass; the output is the same as "
              "without. With --router only off is accepted: the request opts out of the "
              "decode workers' speculation"),
          ValueFlag("spec-tokens", "K", "4", "Most tokens proposed per step"),
          ValueFlag("draft-model", "PATH", "", "The draft model of --speculative=draft"),
          ValueFlag("router", "HOST:PORT", "",
                    "Generate through a running router instead of loading the model (TLS when a "
                    "--tls-* flag is given)"),
          ValueFlag("timeout", "S", "600", "With --router: the request's deadline (seconds)"),
      });
  return {"tandem generate",
          "Runs a model on a prompt and prints the prompt, then the completion on stdout as it "
          "is generated; timings (TTFT, tokens/s) go to stderr.",
          Concat(std::move(flags), ClientFlags()), "", kPathHelp};
}

Flags::Command ScoreCommand() {
  return {"tandem score", "Per-token log-probabilities and the mean cross-entropy / perplexity.",
          Concat(ModelFlags(), {ValueFlag("text", "TEXT", "", "The text scored (required)")}), "",
          kPathHelp};
}

Flags::Command TokenizeCommand() {
  return {"tandem tokenize",
          "Reads text on stdin, prints the ids as a JSON array.",
          {ValueFlag("tokenizer", "PATH", "", "The tokenizer (required)"),
           BoolFlag("add-special-tokens", "Add the tokenizer's special tokens (e.g. BOS)")},
          "",
          kPathHelp};
}

Flags::Command DetokenizeCommand() {
  return {"tandem detokenize",
          "Reads a JSON array of ids on stdin, prints the text.",
          {ValueFlag("tokenizer", "PATH", "", "The tokenizer (required)")},
          "",
          kPathHelp};
}

Flags::Command BenchReportCommand() {
  return {"tandem bench report",
          "Compares runs of tandem bench (their --json files, given as arguments); draws latency "
          "CDFs and throughput against rate.",
          {RepeatedFlag("label", "NAME", "The runs' names, in order (default: the file names)"),
           ValueFlag("svg", "OUT.svg", "", "Write the charts here")},
          "FILE.json..."};
}

Flags::Command BenchCommand() {
  std::vector<FlagSpec> flags =
      Concat(BenchWorkloadFlags(),
             {ValueFlag("router", "HOST:PORT", "", "The router under load (required)"),
              ValueFlag("json", "FILE", "", "Write the run (config, summary, requests)"),
              BoolFlag("no-progress", "No progress line on stderr")});
  return {"tandem bench",
          "Load generator: TTFT, TPOT, ITL, E2E percentiles, throughput, goodput. `tandem bench "
          "report FILE.json...` compares runs.",
          Concat(std::move(flags), ClientFlags()), "",
          "SPEC: N | uniform:LO:HI | lognormal:MEDIAN:SIGMA, optionally :max=M."};
}

Flags::Command UpCommand() {
  std::vector<FlagSpec> flags = Concat(
      ModelFlags(),
      {
          ValueFlag("prefill", "N", "1", "Prefill workers"),
          ValueFlag("decode", "M", "1", "Decode workers"),
          ValueFlag("router-port", "P", "0", "The router's gRPC port (0: pick a free one)"),
          ValueFlag("http-port", "P", "0", "The OpenAI-compatible API's port (0: pick a free one)"),
          BoolFlag("no-http-metrics", "/metrics only on the metrics ports, not the HTTP port"),
          ValueFlag("tls-cert", "PEM", "", "Every process serves TLS with this certificate"),
          ValueFlag("tls-key", "PEM", "", "Key of --tls-cert"),
          ValueFlag("tls-ca", "PEM", "", "Mutual TLS: the CA every process trusts"),
          ValueFlag("api-keys-file", "PATH", "", "The router's API keys"),
          ValueFlag("cluster-secret-file", "PATH", "",
                    "The cluster's secret (default: a new one for the cluster's lifetime)"),
          ValueFlag("chat-template", "PATH", "", "The router's chat template"),
          ValueFlag("served-model-name", "NAME", "", "The model's name in the OpenAI API"),
          ValueFlag("prefill-nice", "0-19", std::to_string(ClusterOptions{}.prefill_nice),
                    "The prefill workers' CPU niceness (0: none), so that decode steps sharing the "
                    "cores keep their pace while prompts are computed"),
          BoolFlag(
              "prefill-idle",
              "Run the prefill workers at SCHED_IDLE instead (CPU only when nothing else wants "
              "it: the steadiest decode pace, and more time to first token)"),
          ValueFlag("restart", "always|never", "always",
                    "A worker that exits is started again (always: after 0, 1, 2, 4, 8 s within "
                    "a minute, then no more) or the whole cluster stops (never)"),
      });
  return {"tandem up",
          "Starts a router, N prefill and M decode workers on 127.0.0.1; prints \"ready "
          "router=HOST:PORT\" when all are registered, \"internal router=HOST:PORT "
          "secret=FILE\" (where more workers register, and the secret they need), then "
          "\"metrics ROLE=HOST:PORT\" lines and \"http router=HOST:PORT\" (the "
          "OpenAI-compatible API); Ctrl-C stops them. A worker that exits is started again (at "
          "most 5 times a minute); the router's exit stops the cluster. TLS flags go to every "
          "process; the API "
          "keys, chat template, served model name and --no-http-metrics to the router.",
          std::move(flags), "", kPathHelp};
}

Flags::Command ModelConvertCommand() {
  return {"tandem model convert",
          "Writes a Hugging Face directory (config.json + model.safetensors; from a GGUF file "
          "also tokenizer.json and tokenizer_config.json).",
          {ValueFlag("from", "CHECKPOINT.bin|MODEL.gguf", "", "The model (required)"),
           ValueFlag("out", "DIR", "", "The directory written (required)")}};
}

Flags::Command ModelRandomCommand() {
  return {"tandem model random",
          "Random weights of a real model's shape, written as a Hugging Face directory.",
          {ValueFlag("shape", "NAME", "",
                     "stories260K, stories15M, stories110M, TinyLlama-1.1B, Llama-2-7B, "
                     "Llama-3-8B, Mixtral-8x7B or Qwen3-30B-A3B (required)"),
           ValueFlag("out", "DIR", "", "The directory written (required)"),
           ValueFlag("dtype", "f32|bf16|f16", "bf16", "The weights"),
           ValueFlag("seed", "S", "0", "Random seed")}};
}

constexpr char kModelUsage[] = R"(usage:
  tandem model convert --from CHECKPOINT.bin|MODEL.gguf --out DIR
  tandem model random --shape NAME --out DIR [--dtype f32|bf16|f16] [--seed S]
`tandem model convert --help` and `tandem model random --help` give their flags.
)";

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tandem: %s\n", std::string(s.message()).c_str());
  return s.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

struct Loaded {
  std::string device;  // "cpu" or "cuda" (--device resolved)
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

absl::StatusOr<Loaded> LoadModelAndTokenizer(const Flags& f) {
  if (!f.Has("model")) return absl::InvalidArgumentError("--model is required");
  // --dtype: the weight storage; matrices stored otherwise are converted at load.
  std::optional<DType> weight_dtype;
  if (f.Has("dtype")) {
    auto dt = ParseWeightDType(f.Get("dtype"));
    if (!dt.ok()) return dt.status();
    weight_dtype = *dt;
  }
  Loaded l;
  // The model is loaded on the host either way (the CPU backend); with "cuda" the generate
  // command uploads it to the device model.
  auto device = ResolveDevice(f.Get("device"));
  if (!device.ok()) return device.status();
  l.device = *device;
  auto backend = MakeBackend("cpu");
  if (!backend.ok()) return backend.status();
  l.backend = std::move(*backend);
  auto model = Model::Load(f.Get("model"), l.backend.get(), weight_dtype);
  if (!model.ok()) return model.status();
  l.model = std::move(*model);
  if (l.device == "cuda" && f.Get("device") == "auto" &&
      !CudaSupportsModel(l.model->config()).ok()) {
    l.device = "cpu";  // a layout the CUDA runner does not compute runs on the CPU
  }
  std::string tok_path = f.Get("tokenizer");
  if (tok_path.empty()) {
    auto found = FindTokenizerFor(f.Get("model"), l.model->config().vocab_size);
    if (!found.ok()) return found.status();
    tok_path = *found;
  }
  auto tok = LoadTokenizer(
      tok_path, l.model->config().architecture == "llama2c" ? l.model->config().vocab_size : 0);
  if (!tok.ok()) return tok.status();
  l.tokenizer = std::move(*tok);
  return l;
}

// --tls-ca/--tls-cert/--tls-key and --api-key (else $TANDEM_API_KEY) of a router client.
ClientSecurity ClientSecurityFrom(const Flags& f) {
  ClientSecurity s;
  s.tls = {f.Get("tls-cert"), f.Get("tls-key"), f.Get("tls-ca")};
  s.api_key = ApiKeyFromFlagOrEnv(f.Get("api-key"));
  return s;
}

// The request and engine options of `tandem generate`'s flags.
absl::Status ParseGenerateFlags(const Flags& f, GenerationRequest* req, GeneratorOptions* opts) {
  GenerationRequest& r = *req;
  auto max_tokens = f.GetInt("max-tokens");
  auto temperature = f.GetDouble("temperature");
  auto top_k = f.GetInt("top-k");
  auto top_p = f.GetDouble("top-p");
  auto seed = f.GetInt("seed");
  auto presence = f.GetDouble("presence-penalty");
  auto frequency = f.GetDouble("frequency-penalty");
  auto repetition = f.GetDouble("repetition-penalty");
  auto min_tokens = f.GetInt("min-tokens");
  for (const auto* d : {&presence, &frequency, &repetition}) {
    if (!d->ok()) return d->status();
  }
  if (!min_tokens.ok()) return min_tokens.status();
  auto block_size = f.GetInt("block-size");
  auto chunk = f.GetInt("prefill-chunk");
  for (const auto* s : {&max_tokens, &top_k, &seed, &block_size, &chunk}) {
    if (!s->ok()) return s->status();
  }
  if (!temperature.ok()) return temperature.status();
  if (!top_p.ok()) return top_p.status();
  if (*max_tokens < 1 || *max_tokens > (1 << 30)) {
    return absl::InvalidArgumentError("--max-tokens must be in [1, 2^30]");
  }
  r.max_tokens = static_cast<int>(*max_tokens);
  r.sampling.temperature = static_cast<float>(*temperature);
  r.sampling.top_k = static_cast<int>(std::clamp<int64_t>(*top_k, -1, 1 << 30));
  r.sampling.top_p = static_cast<float>(*top_p);
  r.sampling.seed = static_cast<uint64_t>(*seed);
  r.sampling.presence_penalty = static_cast<float>(*presence);
  r.sampling.frequency_penalty = static_cast<float>(*frequency);
  r.sampling.repetition_penalty = static_cast<float>(*repetition);
  r.sampling.min_tokens = static_cast<int>(std::clamp<int64_t>(*min_tokens, -1, 1 << 30));
  r.stop_strings = f.GetAll("stop");
  r.ignore_eos = f.Has("ignore-eos");
  r.speculative = f.Get("speculative") != "off";
  if (f.Has("json-object") && f.Has("json-schema")) {
    return absl::InvalidArgumentError("--json-object and --json-schema: pick one");
  }
  if (f.Has("json-object")) r.sampling.json_schema = kJsonObjectSchema;
  if (f.Has("json-schema")) {
    std::string schema = f.Get("json-schema");
    if (schema.starts_with("@")) {
      auto text = ReadFileToString(schema.substr(1));
      if (!text.ok()) return text.status();
      schema = *text;
    }
    if (auto compiled = structured::JsonSchema::Compile(schema); !compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--json-schema: ", compiled.status().message()));
    }
    r.sampling.json_schema = schema;
  }
  if (absl::Status s = r.sampling.Validate(); !s.ok()) return s;
  opts->block_size = static_cast<int>(std::clamp<int64_t>(*block_size, 0, 1 << 20));
  opts->prefill_chunk = static_cast<int>(std::clamp<int64_t>(*chunk, -1, 1 << 30));
  auto kv_dtype = ParseKvDtype(f.Get("kv-dtype"));
  if (!kv_dtype.ok()) return kv_dtype.status();
  opts->kv_dtype = *kv_dtype;
  if (f.Has("speculative")) {
    auto method = ParseSpeculativeMethod(f.Get("speculative"));
    if (!method.ok()) return method.status();
    opts->speculative.method = *method;
    auto k = f.GetInt("spec-tokens");
    if (!k.ok()) return k.status();
    if (absl::Status s = ValidateSpecTokens(*k); !s.ok()) return s;
    opts->speculative.num_tokens = static_cast<int>(*k);
  }
  if (!opts->speculative.enabled() && f.Has("spec-tokens")) {
    return absl::InvalidArgumentError("--spec-tokens needs --speculative ngram|draft");
  }
  if ((opts->speculative.method == SpeculativeMethod::kDraft) != f.Has("draft-model")) {
    return absl::InvalidArgumentError(
        "--draft-model: given exactly when --speculative=draft (a model of the same tokenizer)");
  }
  if (absl::Status s = opts->Validate(); !s.ok()) return s;
  return absl::OkStatus();
}

// `tandem generate --router`: the same request through a running router.
int GenerateRemote(const Flags& f, const std::string& prompt, const GenerationRequest& req) {
  if (f.Has("speculative") && f.Get("speculative") != "off") {
    return Fail(absl::InvalidArgumentError(
        "--speculative: with --router, decode workers speculate as tandem-server's --speculative "
        "says; only --speculative=off (this request opts out) is a per-request choice"));
  }
  RemoteGenerateRequest r;
  r.router = f.Get("router");
  r.prompt = prompt;
  r.sampling = req.sampling;
  r.max_tokens = req.max_tokens;
  r.stop = req.stop_strings;
  r.ignore_eos = req.ignore_eos;
  r.speculative = req.speculative;
  auto timeout = f.GetDouble("timeout");
  if (!timeout.ok()) return Fail(timeout.status());
  r.timeout_seconds = *timeout;
  r.security = ClientSecurityFrom(f);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  auto res = RemoteGenerate(r, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!res.ok()) return Fail(res.status());
  const double decode_s = res->e2e_seconds - res->ttft_seconds;
  std::fprintf(stderr,
               "[tandem] generated %zu tokens via %s, finish=%s, TTFT %.1f ms, decode %.1f "
               "tokens/s\n",
               res->tokens.size(), r.router.c_str(), res->finish_reason.c_str(),
               res->ttft_seconds * 1e3,
               res->tokens.size() > 1 && decode_s > 0 ? (res->tokens.size() - 1) / decode_s : 0.0);
  return 0;
}

// `tandem generate --model`: the model in this process.
int GenerateLocal(const Flags& f, const std::string& prompt, GenerationRequest req,
                  GeneratorOptions opts) {
  auto loaded = LoadModelAndTokenizer(f);
  if (!loaded.ok()) return Fail(loaded.status());
  req.prompt = loaded->tokenizer->Encode(prompt, /*add_special_tokens=*/true);
  // Not past the context: generation also stops there (finish reason "context").
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  std::fflush(stdout);
  std::unique_ptr<ModelRunner> runner;
  if (loaded->device == "cuda") {
    // Room for this one request, on the device.
    const ModelConfig& c = loaded->model->config();
    ModelRunnerOptions ro;
    ro.block_size = opts.block_size;
    ro.num_blocks = (c.max_seq_len + opts.block_size - 1) / opts.block_size;
    ro.max_batch_tokens = std::min(opts.max_step_tokens, c.max_seq_len);
    ro.max_seqs = 1;
    // A step scoring proposals has a row per token.
    ro.max_logit_rows = opts.speculative.enabled() ? opts.speculative.num_tokens + 1 : 1;
    auto kv = ResolveKvDtype(f.Get("kv-dtype"), "cuda", c);
    if (!kv.ok()) return Fail(kv.status());
    ro.kv_dtype = *kv;
    auto r = MakeModelRunner("cuda", loaded->model.get(), ro);
    if (!r.ok()) return Fail(r.status());
    runner = std::move(*r);
    opts.runner = runner.get();
  }
  std::unique_ptr<Model> draft;
  if (opts.speculative.method == SpeculativeMethod::kDraft) {
    // Loaded on the host as stored; the Generator runs it where the model runs.
    auto d = Model::Load(f.Get("draft-model"), loaded->backend.get());
    if (!d.ok()) {
      return Fail(
          absl::Status(d.status().code(), absl::StrCat("--draft-model: ", d.status().message())));
    }
    draft = std::move(*d);
    opts.speculative.draft = draft.get();
  }
  // The tokenizer outlives the generator: a non-owning handle for the constraints.
  opts.constraints = std::make_shared<OutputConstraints>(
      std::shared_ptr<const Tokenizer>(loaded->tokenizer.get(), [](const Tokenizer*) {}));
  Generator gen(loaded->model.get(), loaded->tokenizer.get(), opts);
  auto out = gen.Generate({&req, 1}, [](int, int, std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (!out.ok()) return Fail(out.status());
  const GenerationStats& st = gen.stats();
  const double decode_s = st.total_seconds - st.first_token_seconds;
  std::fprintf(
      stderr,
      "[tandem] prompt %lld tokens, generated %lld tokens, finish=%s, TTFT %.1f ms, "
      "decode %.1f tokens/s (device %s)\n",
      static_cast<long long>(st.prompt_tokens), static_cast<long long>(st.generated_tokens),
      std::string(FinishReasonName((*out)[0].finish)).c_str(), st.first_token_seconds * 1e3,
      st.generated_tokens > 1 && decode_s > 0 ? (st.generated_tokens - 1) / decode_s : 0.0,
      loaded->device.c_str());
  if (opts.speculative.enabled()) {
    std::fprintf(
        stderr, "[tandem] speculative: %lld tokens proposed, %lld accepted (%.0f%%), %lld steps\n",
        static_cast<long long>(st.proposed_tokens), static_cast<long long>(st.accepted_tokens),
        st.proposed_tokens > 0 ? 100.0 * st.accepted_tokens / st.proposed_tokens : 0.0,
        static_cast<long long>(st.steps));
  }
  return 0;
}

int Generate(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, GenerateCommand(), &f)) return *exit;
  if (!f->Has("prompt")) return Fail(absl::InvalidArgumentError("--prompt is required"));
  GenerationRequest req;
  GeneratorOptions opts;
  if (absl::Status s = ParseGenerateFlags(*f, &req, &opts); !s.ok()) return Fail(s);
  const std::string prompt = f->Get("prompt");
  if (f->Has("router")) return GenerateRemote(*f, prompt, req);
  return GenerateLocal(*f, prompt, std::move(req), std::move(opts));
}

int Score(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, ScoreCommand(), &f)) return *exit;
  if (!f->Has("text")) return Fail(absl::InvalidArgumentError("--text is required"));
  auto kv_dtype = ParseKvDtype(f->Get("kv-dtype"));
  if (!kv_dtype.ok()) return Fail(kv_dtype.status());
  if (f->Get("device") == "cuda") {
    return Fail(absl::UnimplementedError(
        "--device=cuda: score runs on the CPU backend (use --device cpu or auto)"));
  }
  auto loaded = LoadModelAndTokenizer(*f);
  if (!loaded.ok()) return Fail(loaded.status());
  const std::vector<int> ids = loaded->tokenizer->Encode(f->Get("text"), true);
  auto lp = ScoreTokens(*loaded->model, ids, *kv_dtype);
  if (!lp.ok()) return Fail(lp.status());
  double nll = 0;
  std::printf("position\ttoken_id\ttoken\tlogprob\n");
  for (size_t i = 0; i < lp->size(); ++i) {
    const int id = ids[i + 1];
    nlohmann::json piece = loaded->tokenizer->Decode(std::span<const int>(&id, 1));
    std::printf("%zu\t%d\t%s\t%.6f\n", i + 1, id,
                piece.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str(),
                (*lp)[i]);
    nll -= (*lp)[i];
  }
  nll /= static_cast<double>(lp->size());
  std::printf("tokens_scored=%zu mean_cross_entropy=%.6f perplexity=%.4f\n", lp->size(), nll,
              std::exp(nll));
  return 0;
}

int Tokenize(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, TokenizeCommand(), &f)) return *exit;
  if (!f->Has("tokenizer")) return Fail(absl::InvalidArgumentError("--tokenizer is required"));
  auto tok = LoadTokenizer(f->Get("tokenizer"));
  if (!tok.ok()) return Fail(tok.status());
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  if (auto* hf = dynamic_cast<const HfTokenizer*>(tok->get())) {
    auto ids = hf->EncodeChecked(text, f->Has("add-special-tokens"));
    if (!ids.ok()) return Fail(ids.status());
    std::printf("%s\n", nlohmann::json(*ids).dump().c_str());
    return 0;
  }
  std::printf("%s\n",
              nlohmann::json((*tok)->Encode(text, f->Has("add-special-tokens"))).dump().c_str());
  return 0;
}

int Detokenize(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, DetokenizeCommand(), &f)) return *exit;
  if (!f->Has("tokenizer")) return Fail(absl::InvalidArgumentError("--tokenizer is required"));
  auto tok = LoadTokenizer(f->Get("tokenizer"));
  if (!tok.ok()) return Fail(tok.status());
  std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_array()) {
    return Fail(absl::InvalidArgumentError("stdin: expected a JSON array of token ids"));
  }
  std::vector<int> ids;
  for (const auto& e : j) {
    if (!e.is_number_integer() || e.get<int64_t>() < 0 ||
        e.get<int64_t>() >= (*tok)->vocab_size()) {
      return Fail(absl::InvalidArgumentError(absl::StrFormat(
          "stdin: %s is not a token id in [0, %d)", e.dump(), (*tok)->vocab_size())));
    }
    ids.push_back(e.get<int>());
  }
  const std::string out = (*tok)->Decode(ids);
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

int BenchReport(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, BenchReportCommand(), &f)) return *exit;
  if (f->positional().empty())
    return Fail(absl::InvalidArgumentError("bench report: name JSON files"));
  std::vector<nlohmann::json> runs;
  std::vector<std::string> labels = f->GetAll("label");
  for (size_t i = 0; i < f->positional().size(); ++i) {
    const std::string& path = f->positional()[i];
    auto text = ReadFileToString(path);
    if (!text.ok()) return Fail(text.status());
    auto j = nlohmann::json::parse(*text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("summary")) {
      return Fail(
          absl::InvalidArgumentError(absl::StrFormat("%s: not a tandem bench JSON file", path)));
    }
    if (labels.size() <= i) labels.push_back(path);
    std::printf("== %s\n%s", labels[i].c_str(), j["summary"].dump(2).c_str());
    std::printf("\n");
    runs.push_back(std::move(j));
  }
  if (f->Has("svg")) {
    auto svg = bench::RenderReportSvg(runs, labels);
    if (!svg.ok()) return Fail(svg.status());
    if (absl::Status s = WriteStringToFile(f->Get("svg"), *svg); !s.ok()) return Fail(s);
    std::fprintf(stderr, "wrote %s\n", f->Get("svg").c_str());
  }
  return 0;
}

int Bench(const std::vector<std::string>& args) {
  if (!args.empty() && args[0] == "report") {
    return BenchReport(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, BenchCommand(), &f)) return *exit;
  auto config = BenchConfigFromFlags(*f);
  if (!config.ok()) return Fail(config.status());
  bench::BenchConfig c = *config;
  c.router = f->Get("router");
  c.progress = !f->Has("no-progress");
  auto run = bench::RunBench(c, ClientSecurityFrom(*f));
  if (!run.ok()) return Fail(run.status());
  std::printf("%s", bench::FormatSummary(run->summary).c_str());
  if (f->Has("json")) {
    if (absl::Status s = WriteStringToFile(f->Get("json"), run->ToJson().dump(1) + "\n"); !s.ok()) {
      return Fail(s);
    }
    std::fprintf(stderr, "wrote %s\n", f->Get("json").c_str());
  }
  return 0;
}

int Up(const std::vector<std::string>& args) {
  absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
  if (auto exit = ParseOrExit(args, UpCommand(), &f)) return *exit;
  if (!f->Has("model")) return Fail(absl::InvalidArgumentError("--model is required"));
  ClusterOptions o;
  o.prefill_idle = f->Has("prefill-idle");
  if (f->Get("restart") != "always" && f->Get("restart") != "never") {
    return Fail(absl::InvalidArgumentError(
        absl::StrFormat("--restart: must be always or never, got \"%s\"", f->Get("restart"))));
  }
  o.restart_workers = f->Get("restart") == "always";
  o.model = f->Get("model");
  o.tokenizer = f->Get("tokenizer");
  auto p = f->GetInt("prefill");
  auto d = f->GetInt("decode");
  auto port = f->GetInt("router-port");
  auto http_port = f->GetInt("http-port");
  auto prefill_nice = f->GetInt("prefill-nice");
  for (const auto* v : {&p, &d, &port, &http_port, &prefill_nice}) {
    if (!v->ok()) return Fail(v->status());
  }
  if (*p < 1 || *p > 64 || *d < 1 || *d > 64) {
    return Fail(absl::InvalidArgumentError("--prefill and --decode must be in [1, 64]"));
  }
  if (*port < 0 || *port > 65535)
    return Fail(absl::InvalidArgumentError("--router-port must be in [0, 65535]"));
  if (*http_port < 0 || *http_port > 65535)
    return Fail(absl::InvalidArgumentError("--http-port must be in [0, 65535]"));
  if (*prefill_nice < 0 || *prefill_nice > 19) {
    return Fail(absl::InvalidArgumentError("--prefill-nice must be in [0, 19]"));
  }
  o.prefill_nice = static_cast<int>(*prefill_nice);
  o.http_port = static_cast<int>(*http_port);
  o.prefill = static_cast<int>(*p);
  o.decode = static_cast<int>(*d);
  o.router_port = static_cast<int>(*port);
  o.tls = {f->Get("tls-cert"), f->Get("tls-key"), f->Get("tls-ca")};
  o.api_keys_file = f->Get("api-keys-file");
  o.cluster_secret_file = f->Get("cluster-secret-file");
  if (f->Has("device")) o.extra_worker_flags = {"--device", f->Get("device")};
  if (f->Has("dtype")) {
    if (absl::Status s = ParseWeightDType(f->Get("dtype")).status(); !s.ok()) return Fail(s);
    o.extra_worker_flags.insert(o.extra_worker_flags.end(), {"--dtype", f->Get("dtype")});
  }
  if (f->Has("kv-dtype")) {
    if (absl::Status s = ParseKvDtype(f->Get("kv-dtype")).status(); !s.ok()) return Fail(s);
    o.extra_worker_flags.insert(o.extra_worker_flags.end(), {"--kv-dtype", f->Get("kv-dtype")});
  }
  for (const char* name : {"chat-template", "served-model-name"}) {
    if (f->Has(name)) {
      o.extra_router_flags.insert(o.extra_router_flags.end(),
                                  {std::string("--") + name, f->Get(name)});
    }
  }
  if (f->Has("no-http-metrics")) o.extra_router_flags.push_back("--no-http-metrics");
  return RunLocalCluster(o);
}

int ModelCommand(const std::vector<std::string>& args) {
  const bool help = std::any_of(args.begin(), args.end(),
                                [](const std::string& a) { return a == "--help" || a == "-h"; });
  if (args.empty() || (help && args[0] != "convert" && args[0] != "random")) {
    std::fputs(kModelUsage, args.empty() ? stderr : stdout);
    return args.empty() ? 2 : 0;
  }
  const std::string sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "convert") {
    absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
    if (auto exit = ParseOrExit(rest, ModelConvertCommand(), &f)) return *exit;
    if (!f->Has("from") || !f->Has("out")) {
      return Fail(absl::InvalidArgumentError("model convert needs --from and --out"));
    }
    if (IsGgufFile(f->Get("from"))) {
      if (absl::Status s = ConvertGgufToHf(f->Get("from"), f->Get("out")); !s.ok()) return Fail(s);
      std::fprintf(stderr,
                   "wrote %s/config.json, model.safetensors, tokenizer.json and "
                   "tokenizer_config.json\n",
                   f->Get("out").c_str());
      return 0;
    }
    if (absl::Status s = ConvertLlama2cToHf(f->Get("from"), f->Get("out")); !s.ok()) return Fail(s);
    std::fprintf(stderr, "wrote %s/config.json and model.safetensors\n", f->Get("out").c_str());
    return 0;
  }
  if (sub == "random") {
    absl::StatusOr<Flags> f = absl::UnknownError("unparsed");
    if (auto exit = ParseOrExit(rest, ModelRandomCommand(), &f)) return *exit;
    if (!f->Has("shape") || !f->Has("out")) {
      return Fail(absl::InvalidArgumentError("model random needs --shape and --out"));
    }
    auto config = RandomModelConfig(f->Get("shape"));
    if (!config.ok()) return Fail(config.status());
    auto dtype_or = ParseWeightDType(f->Get("dtype"));
    if (!dtype_or.ok()) return Fail(dtype_or.status());
    const DType dtype = *dtype_or;
    if (IsQuantized(dtype)) {
      return Fail(absl::InvalidArgumentError(
          "model random writes safetensors: --dtype must be f32, bf16 or f16"));
    }
    auto seed = f->GetInt("seed");
    if (!seed.ok()) return Fail(seed.status());
    if (absl::Status s = WriteRandomModel(*config, dtype, *seed, f->Get("out")); !s.ok())
      return Fail(s);
    std::fprintf(stderr, "wrote %s (%s, %s)\n", f->Get("out").c_str(), f->Get("shape").c_str(),
                 std::string(DTypeName(dtype)).c_str());
    return 0;
  }
  return Fail(absl::InvalidArgumentError(absl::StrFormat("model: unknown subcommand %s", sub)));
}

}  // namespace
}  // namespace tandem

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "help") {
    std::fputs(tandem::kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (std::string(argv[1]) == "--version") {
    std::printf("tandem %s\n", TANDEM_VERSION);
    return 0;
  }
  const std::string cmd = argv[1];
  const std::vector<std::string> args(argv + 2, argv + argc);
  // Every command answers --help with its flags (made from their declarations above).
  if (cmd == "generate") return tandem::Generate(args);
  if (cmd == "score") return tandem::Score(args);
  if (cmd == "tokenize") return tandem::Tokenize(args);
  if (cmd == "detokenize") return tandem::Detokenize(args);
  if (cmd == "model") return tandem::ModelCommand(args);
  if (cmd == "up") return tandem::Up(args);
  if (cmd == "bench") return tandem::Bench(args);
  if (cmd == "plan") return tandem::PlanCommand(args);
  std::fprintf(stderr, "tandem: unknown command %s\n\n%s", cmd.c_str(), tandem::kUsage);
  return 2;
}
