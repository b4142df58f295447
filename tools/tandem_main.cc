// `tandem`: the command-line tool. Subcommands:
//   generate   run a model on a prompt and stream the completion
//   score      per-token log-probabilities and perplexity of a text
//   tokenize   text on stdin -> JSON array of ids
//   detokenize JSON array of ids on stdin -> text
//   model convert | model random   write Hugging Face model directories
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
  generate --model PATH [--tokenizer PATH] --prompt TEXT [--max-tokens N]
           [--temperature T] [--top-k K] [--top-p P] [--seed S] [--stop TEXT]...
           [--presence-penalty X] [--frequency-penalty X] [--repetition-penalty X]
           [--min-tokens N] [--block-size N] [--prefill-chunk N] [--device auto|cpu|cuda]
           [--dtype DTYPE] [--kv-dtype auto|f32|bf16|f16|fp8]
           [--json-object | --json-schema SCHEMA|@FILE]
           [--speculative off|ngram|draft [--spec-tokens K] [--draft-model PATH]]
      Prints the prompt and then the completion on stdout as it is generated;
      timings (TTFT, tokens/s) go to stderr. --dtype: the weights, converted at load
      when stored otherwise (f32, bf16, f16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q5_k,
      q6_k; default: as stored). --kv-dtype: the KV cache (auto: bf16 with
      --device=cuda where the model's head_dim has FlashInfer attention, else f32).
      --json-schema: the output is one JSON value valid against the schema (JSON
      text, or @FILE to read it from FILE); --json-object: any JSON object.
      --speculative: each step proposes up to K (default 4) tokens, by prompt lookup
      (ngram) or by a small draft model of the same tokenizer decoding greedily
      (draft, --draft-model PATH), and scores them in one forward pass; the output is
      the same as without. With --router only "off" is accepted: the request opts
      out of the decode workers' speculation.
  score --model PATH [--tokenizer PATH] --text TEXT [--dtype DTYPE]
        [--kv-dtype auto|f32|bf16|f16|fp8]
      Per-token log-probabilities and the mean cross-entropy / perplexity.
  tokenize --tokenizer PATH [--add-special-tokens]
      Reads text on stdin, prints the ids as a JSON array.
  detokenize --tokenizer PATH
      Reads a JSON array of ids on stdin, prints the text.
  generate --router HOST:PORT --prompt TEXT [sampling flags as above] [--timeout S]
           [--tls-ca PEM [--tls-cert PEM --tls-key PEM]] [--api-key KEY]
      The same through a running router (TLS when a --tls-* flag is given; the
      API key defaults to $TANDEM_API_KEY).
  up --model PATH [--tokenizer PATH] [--prefill N] [--decode M] [--router-port P]
     [--tls-cert PEM --tls-key PEM [--tls-ca PEM]] [--api-keys-file PATH] [--http-port P]
     [--http-metrics] [--device auto|cpu|cuda] [--cluster-secret-file PATH] [--dtype DTYPE]
     [--kv-dtype auto|f32|bf16|f16|fp8] [--chat-template PATH] [--served-model-name NAME]
     [--prefill-nice 0-19 | --prefill-idle]
      Starts a router, N prefill and M decode workers on 127.0.0.1; prints
      "ready router=HOST:PORT" when all are registered, "internal router=HOST:PORT
      secret=FILE" (where more workers register, and the secret they need), then
      "metrics ROLE=HOST:PORT" lines and "http router=HOST:PORT" (the OpenAI-compatible
      API); Ctrl-C stops them. TLS flags go to every process, the API keys, chat
      template, served model name and --http-metrics (/metrics on the HTTP port too)
      to the router;
      without --cluster-secret-file a new secret is made for the cluster's lifetime.
      The prefill workers run at CPU niceness --prefill-nice (default 10; 0: none), so
      that decode steps sharing the cores keep their pace while prompts are computed;
      --prefill-idle runs them at SCHED_IDLE instead (CPU only when nothing else wants
      it: the steadiest decode pace, and more time to first token).
  bench --router HOST:PORT [--rate R [--arrival poisson|constant|gamma]
        [--burstiness B] | --concurrency C] [--input-len SPEC] [--output-len SPEC]
        [--trace FILE.jsonl] [--num-requests N] [--duration S] [--warmup N] [--seed S]
        [--max-tokens N] [--slo-ttft S] [--slo-tpot S] [--json FILE] [--no-progress]
        [--tls-ca PEM [--tls-cert PEM --tls-key PEM]] [--api-key KEY]
      Load generator: TTFT, TPOT, ITL, E2E percentiles, throughput, goodput.
      SPEC: N | uniform:LO:HI | lognormal:MEDIAN:SIGMA, optionally :max=M.
      --max-tokens N: requests declare max_tokens N and end at their output length
      (the client stops reading, as an answer ends at EOS before its limit).
  bench report FILE.json... [--label NAME]... [--svg OUT.svg]
      Compares runs; draws latency CDFs and throughput vs rate.
  plan --model CONFIG --hardware PROFILE --workload SPEC --slo-ttft S --slo-tpot S
       [--gpus N] [--json FILE]      (tandem plan --help for the rest)
      Capacity planning: prefill/decode counts ranked by goodput per GPU.
  plan simulate | plan calibrate
      One configuration simulated, printed as `tandem bench` prints a run;
      fitting the `local` profile to measured step times.
  model convert --from CHECKPOINT.bin|MODEL.gguf --out DIR
      Writes a Hugging Face directory (config.json + model.safetensors; from a
      GGUF file also tokenizer.json and tokenizer_config.json).
  model random --shape NAME --out DIR [--dtype f32|bf16|f16] [--seed S]
      Random weights of a real model's shape: stories260K, stories15M,
      stories110M, TinyLlama-1.1B, Llama-2-7B, Llama-3-8B, Mixtral-8x7B,
      Qwen3-30B-A3B.

PATH is a Hugging Face model directory, a GGUF file (.gguf: its tokenizer and
chat template come with it) or a llama2.c checkpoint (.bin); a tokenizer is a
tokenizer.json (or a directory holding one), a GGUF file or a llama2.c
tokenizer.bin.
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
  auto device = ResolveDevice(f.Get("device", "auto"));
  if (!device.ok()) return device.status();
  l.device = *device;
  auto backend = MakeBackend("cpu");
  if (!backend.ok()) return backend.status();
  l.backend = std::move(*backend);
  auto model = Model::Load(f.Get("model"), l.backend.get(), weight_dtype);
  if (!model.ok()) return model.status();
  l.model = std::move(*model);
  if (l.device == "cuda" && f.Get("device", "auto") == "auto" &&
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
  auto max_tokens = f.GetInt("max-tokens", 256);
  auto temperature = f.GetDouble("temperature", 1.0);
  auto top_k = f.GetInt("top-k", 0);
  auto top_p = f.GetDouble("top-p", 1.0);
  auto seed = f.GetInt("seed", 0);
  auto presence = f.GetDouble("presence-penalty", 0.0);
  auto frequency = f.GetDouble("frequency-penalty", 0.0);
  auto repetition = f.GetDouble("repetition-penalty", 1.0);
  auto min_tokens = f.GetInt("min-tokens", 0);
  for (const auto* d : {&presence, &frequency, &repetition}) {
    if (!d->ok()) return d->status();
  }
  if (!min_tokens.ok()) return min_tokens.status();
  auto block_size = f.GetInt("block-size", 16);
  auto chunk = f.GetInt("prefill-chunk", 0);
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
  auto kv_dtype = ParseKvDtype(f.Get("kv-dtype", "auto"));
  if (!kv_dtype.ok()) return kv_dtype.status();
  opts->kv_dtype = *kv_dtype;
  if (f.Has("speculative")) {
    auto method = ParseSpeculativeMethod(f.Get("speculative"));
    if (!method.ok()) return method.status();
    opts->speculative.method = *method;
    auto k = f.GetInt("spec-tokens", opts->speculative.num_tokens);
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
  auto timeout = f.GetDouble("timeout", 600);
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
    CudaRunnerOptions ro;
    ro.block_size = opts.block_size;
    ro.num_blocks = (c.max_seq_len + opts.block_size - 1) / opts.block_size;
    ro.max_batch_tokens = std::min(opts.max_step_tokens, c.max_seq_len);
    ro.max_seqs = 1;
    // A step scoring proposals has a row per token.
    ro.max_logit_rows = opts.speculative.enabled() ? opts.speculative.num_tokens + 1 : 1;
    auto kv = ResolveKvDtype(f.Get("kv-dtype", "auto"), "cuda", c);
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
  auto f = Flags::Parse(args,
                        {"model",
                         "tokenizer",
                         "prompt",
                         "max-tokens",
                         "temperature",
                         "top-k",
                         "top-p",
                         "seed",
                         "stop",
                         "block-size",
                         "prefill-chunk",
                         "device",
                         "router",
                         "timeout",
                         "dtype",
                         "tls-ca",
                         "tls-cert",
                         "tls-key",
                         "api-key",
                         "kv-dtype",
                         "presence-penalty",
                         "frequency-penalty",
                         "repetition-penalty",
                         "min-tokens",
                         "json-schema",
                         "speculative",
                         "spec-tokens",
                         "draft-model"},
                        {"ignore-eos", "json-object"});
  if (!f.ok()) return Fail(f.status());
  if (!f->Has("prompt")) return Fail(absl::InvalidArgumentError("--prompt is required"));
  GenerationRequest req;
  GeneratorOptions opts;
  if (absl::Status s = ParseGenerateFlags(*f, &req, &opts); !s.ok()) return Fail(s);
  const std::string prompt = f->Get("prompt");
  if (f->Has("router")) return GenerateRemote(*f, prompt, req);
  return GenerateLocal(*f, prompt, std::move(req), std::move(opts));
}

int Score(const std::vector<std::string>& args) {
  auto f = Flags::Parse(args, {"model", "tokenizer", "text", "device", "dtype", "kv-dtype"}, {});
  if (!f.ok()) return Fail(f.status());
  if (!f->Has("text")) return Fail(absl::InvalidArgumentError("--text is required"));
  auto kv_dtype = ParseKvDtype(f->Get("kv-dtype", "auto"));
  if (!kv_dtype.ok()) return Fail(kv_dtype.status());
  if (f->Get("device", "auto") == "cuda") {
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
  auto f = Flags::Parse(args, {"tokenizer"}, {"add-special-tokens"});
  if (!f.ok()) return Fail(f.status());
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
  auto f = Flags::Parse(args, {"tokenizer"}, {});
  if (!f.ok()) return Fail(f.status());
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
  auto f = Flags::Parse(args, {"svg", "label"}, {});
  if (!f.ok()) return Fail(f.status());
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
  std::set<std::string> value_flags = BenchWorkloadFlags();
  value_flags.insert({"router", "json", "tls-ca", "tls-cert", "tls-key", "api-key"});
  auto f = Flags::Parse(args, value_flags, {"no-progress"});
  if (!f.ok()) return Fail(f.status());
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
  auto f =
      Flags::Parse(args,
                   {"model", "tokenizer", "prefill", "decode", "router-port", "tls-cert", "tls-key",
                    "tls-ca", "api-keys-file", "http-port", "device", "cluster-secret-file",
                    "kv-dtype", "dtype", "chat-template", "served-model-name", "prefill-nice"},
                   {"http-metrics", "prefill-idle"});
  if (!f.ok()) return Fail(f.status());
  if (!f->Has("model")) return Fail(absl::InvalidArgumentError("--model is required"));
  ClusterOptions o;
  o.prefill_idle = f->Has("prefill-idle");
  o.model = f->Get("model");
  o.tokenizer = f->Get("tokenizer");
  auto p = f->GetInt("prefill", 1);
  auto d = f->GetInt("decode", 1);
  auto port = f->GetInt("router-port", 0);
  auto http_port = f->GetInt("http-port", 0);
  auto prefill_nice = f->GetInt("prefill-nice", ClusterOptions{}.prefill_nice);
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
  if (f->Has("http-metrics")) o.extra_router_flags.push_back("--http-metrics");
  return RunLocalCluster(o);
}

int ModelCommand(const std::vector<std::string>& args) {
  if (args.empty()) return Fail(absl::InvalidArgumentError("model: expected convert or random"));
  const std::string sub = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "convert") {
    auto f = Flags::Parse(rest, {"from", "out"}, {});
    if (!f.ok()) return Fail(f.status());
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
    auto f = Flags::Parse(rest, {"shape", "out", "dtype", "seed"}, {});
    if (!f.ok()) return Fail(f.status());
    if (!f->Has("shape") || !f->Has("out")) {
      return Fail(absl::InvalidArgumentError("model random needs --shape and --out"));
    }
    auto config = RandomModelConfig(f->Get("shape"));
    if (!config.ok()) return Fail(config.status());
    auto dtype_or = ParseWeightDType(f->Get("dtype", "bf16"));
    if (!dtype_or.ok()) return Fail(dtype_or.status());
    const DType dtype = *dtype_or;
    if (IsQuantized(dtype)) {
      return Fail(absl::InvalidArgumentError(
          "model random writes safetensors: --dtype must be f32, bf16 or f16"));
    }
    auto seed = f->GetInt("seed", 0);
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

namespace tandem {
namespace {

// The entries of kUsage's command list for `command` (a command's entries start on a line
// indented by two spaces with its name), and the closing notes after the list.
std::string CommandUsage(const std::string& command) {
  std::string out = "usage:\n";
  const std::string usage = kUsage;
  bool in_commands = false, selected = false;
  size_t pos = 0;
  while (pos < usage.size()) {
    const size_t end = std::min(usage.find('\n', pos), usage.size());
    const std::string line = usage.substr(pos, end - pos);
    pos = end + 1;
    if (line == "commands:") {
      in_commands = true;
      continue;
    }
    if (!in_commands) continue;
    if (line.empty()) {
      in_commands = false;
      out += "\n";
      continue;
    }
    if (line.size() > 2 && line[0] == ' ' && line[1] == ' ' && line[2] != ' ') {
      selected = line.compare(2, command.size() + 1, command + " ") == 0;
    }
    if (selected) out += line + "\n";
  }
  // The notes after the command list (what PATH and a tokenizer are).
  const size_t notes = usage.find("\n\n", usage.find("commands:"));
  if (notes != std::string::npos) out += usage.substr(notes + 2);
  return out;
}

bool AsksForHelp(const std::vector<std::string>& args) {
  for (const std::string& a : args) {
    if (a == "--help" || a == "-h") return true;
  }
  return false;
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
  // Every command answers --help (`tandem plan --help` with its own, longer text).
  if (tandem::AsksForHelp(args) && !(cmd == "plan" && args[0] == "--help")) {
    const std::string text = tandem::CommandUsage(cmd);
    if (text.find("\n  " + cmd + " ") == std::string::npos) {
      std::fprintf(stderr, "tandem: unknown command %s\n\n%s", cmd.c_str(), tandem::kUsage);
      return 2;
    }
    std::fputs(text.c_str(), stdout);
    return 0;
  }
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
