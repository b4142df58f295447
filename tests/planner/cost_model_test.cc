// The cost model against figures computed by hand (the arithmetic is in the comments), the
// hardware profiles' JSON form, links, model names, and the calibration fit.
#include "planner/cost_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>

#include "engine/loaders/model_writer.h"
#include "planner/calibrate.h"
#include "planner/plan.h"
#include "tests/test_util.h"

namespace tandem::planner {
namespace {

// The H100 profile with the raw roofline: every efficiency 1, no step overhead.
HardwareProfile RawH100() {
  HardwareProfile p = *LoadProfile("h100-sxm");
  p.matmul_efficiency = p.attention_efficiency = p.bandwidth_efficiency = 1;
  p.step_overhead = 0;
  return p;
}

ModelConfig Llama2_7B() { return *RandomModelConfig("Llama-2-7B"); }

TEST(CostModel, H100RidgeIs295FlopPerByte) {
  const HardwareProfile p = RawH100();
  EXPECT_EQ(p.peak_flops, 989e12);  // bf16 dense
  EXPECT_DOUBLE_EQ(p.mem_bandwidth, 3.35e12);
  // 989e12 / 3.35e12 = 295.22 FLOP per byte.
  EXPECT_NEAR(p.ridge(), 295.22, 0.01);
}

TEST(CostModel, Llama2_7BDecodeReads13_5GBIn4Ms) {
  const ModelConfig c = Llama2_7B();  // dim 4096, hidden 11008, 32 layers, 32 heads, vocab 32000
  CostModel m(c, RawH100());
  // Per layer: wq, wk, wv, wo 4 x 4096^2 = 67,108,864; w1, w2, w3 3 x 4096 x 11008 = 135,266,304;
  // 202,375,168 x 32 = 6,476,005,376; classifier 32000 x 4096 = 131,072,000.
  EXPECT_EQ(m.MatrixParams(), 6'607'077'376.0);
  // With the token embedding (131,072,000) and the norms (2 x 4096 x 32 + 4096 = 266,240) the
  // model has 6,738,415,616 parameters: 13.48 GB in fp16, the seed's "13.5 GB".
  const double all_params = m.MatrixParams() + 32000.0 * 4096 + 2.0 * 4096 * 32 + 4096;
  EXPECT_EQ(all_params, 6'738'415'616.0);
  EXPECT_NEAR(all_params * 2 / 1e9, 13.5, 0.05);
  // A decode step reads every matrix (the embedding is only gathered: one row per token):
  // 13.214 GB, at 3.35 TB/s 3.94 ms, "about 4 ms".
  const ChunkShape one{/*context=*/100, /*tokens=*/1};
  const StepCost s = m.Step({&one, 1});
  EXPECT_EQ(s.weight_bytes, 6'607'077'376.0 * 2);
  EXPECT_NEAR(s.weight_bytes / 3.35e12, 3.944e-3, 0.001e-3);
  EXPECT_NEAR(s.seconds, 4e-3, 0.1e-3);
  // It is memory-bound: 2 x 6.6e9 FLOPs take 13 us at 989 TFLOP/s.
  EXPECT_NEAR(s.compute_seconds, 2.0 * 6'607'077'376.0 / 989e12, 1e-7);
  EXPECT_GT(s.memory_seconds, 100 * s.compute_seconds);
  EXPECT_DOUBLE_EQ(s.seconds, s.memory_seconds);  // overlap: the max; no overhead here
}

// A speculative verify step of 1 + 4 tokens on Llama-2-7B: the weights are read once, as for one
// token, so on an H100 it costs about what a plain decode step does; it adds 4 tokens' FLOPs,
// KV writes and classifier rows (4 x 2 x 4096 x 32000 = 1.05 GFLOP more than 4 plain tokens' last
// rows would have).
// A mixture of experts holds every expert, computes k of them per token, and reads from memory
// only the experts a step's tokens chose: Mixtral-8x7B's shape (dim 4096, 8 experts of 14336,
// 2 per token, 32 layers, 8 KV heads, vocab 32000).
TEST(CostModel, MixtureOfExpertsHoldsAllExpertsAndReadsTheChosenOnes) {
  ModelConfig c = Llama2_7B();
  c.n_kv_heads = 8;
  c.hidden_dim = c.expert_hidden_dim = 14336;
  c.n_experts = 8;
  c.n_experts_used = 2;
  CostModel m(c, RawH100());
  // Per layer: attention 2 x 4096^2 + 2 x 4096 x 1024 = 41,943,040; experts 8 x 3 x 4096 x
  // 14336 = 1,409,286,144; router 8 x 4096 = 32,768. x 32 + classifier 131,072,000.
  const double attention = 41'943'040, expert = 3.0 * 4096 * 14336, router = 8 * 4096;
  EXPECT_EQ(m.MatrixParams(), (attention + 8 * expert + router) * 32 + 131'072'000.0);
  // One token: 2 experts per layer computed and read.
  const ChunkShape one{/*context=*/100, /*tokens=*/1};
  const StepCost s1 = m.Step({&one, 1});
  EXPECT_NEAR(s1.weight_bytes, ((attention + 2 * expert + router) * 32 + 131'072'000.0) * 2, 1);
  EXPECT_NEAR(s1.matmul_flops, 2.0 * ((attention + 2 * expert + router) * 32 + 131'072'000.0), 1);
  // 64 tokens at once touch 8 (1 - (3/4)^64) = 8.0 experts: every matrix is read.
  std::vector<ChunkShape> batch(64, one);
  const StepCost s64 = m.Step(batch);
  EXPECT_NEAR(s64.weight_bytes, m.MatrixParams() * 2, m.MatrixParams() * 1e-6);
  EXPECT_NEAR(s64.matmul_flops, 64 * s1.matmul_flops, s1.matmul_flops * 1e-6);
}

TEST(CostModel, VerifyStepCostsAboutOnePlainDecodeStep) {
  CostModel m(Llama2_7B(), RawH100());
  const ChunkShape plain{/*context=*/500, /*tokens=*/1};
  const ChunkShape verify{/*context=*/500, /*tokens=*/5, /*logit_rows=*/5};
  const ChunkShape chunk{/*context=*/500, /*tokens=*/5};  // the same tokens, one logit row
  const StepCost p = m.Step({&plain, 1}), v = m.Step({&verify, 1}), c = m.Step({&chunk, 1});
  EXPECT_EQ(v.weight_bytes, p.weight_bytes);
  EXPECT_NEAR(v.matmul_flops - c.matmul_flops, 4.0 * 2 * 4096 * 32000, 1);
  EXPECT_GT(v.activation_bytes, c.activation_bytes);
  EXPECT_LT(v.seconds, 1.02 * p.seconds);  // memory-bound: still the weights' read
  // logit_rows never exceeds the tokens, nor goes below one.
  const ChunkShape over{500, 5, 99}, under{500, 5, 0};
  EXPECT_EQ(m.Step({&over, 1}).matmul_flops, v.matmul_flops);
  EXPECT_EQ(m.Step({&under, 1}).matmul_flops, c.matmul_flops);
}

TEST(CostModel, AttentionCatchesUpWithWeightsNear25kTokens) {
  const ModelConfig c = Llama2_7B();
  CostModel m(c, RawH100());
  // K and V of one token: 2 x 32 layers x 4096 x 2 bytes = 524,288 bytes.
  EXPECT_EQ(m.KvBytesPerToken(), 524'288.0);
  // A decode step of one sequence at context n reads (n + 1) x 524,288 bytes of KV; the weights
  // are 13,214,154,752 bytes: equal at n + 1 = 25,204 (25,749 with the seed's 13.5 GB).
  const double crossover = 2 * m.MatrixParams() / m.KvBytesPerToken();
  EXPECT_NEAR(crossover, 25'204, 1);
  auto step = [&](int context) {
    const ChunkShape one{context, 1};
    return m.Step({&one, 1});
  };
  EXPECT_LT(step(24'000).kv_read_bytes, step(24'000).weight_bytes);
  EXPECT_GT(step(26'000).kv_read_bytes, step(26'000).weight_bytes);
  // FLOPs cross at the same point for a model without GQA: attention costs 4 x 32 layers x
  // 4096 = 524,288 FLOPs per position attended, the matrices 2 FLOPs per parameter.
  const StepCost at = step(25'203);  // attends 25,204 positions
  EXPECT_NEAR(at.attention_flops / at.matmul_flops, 1.0, 0.001);
  // ... and the step takes twice the weight-only time there.
  EXPECT_NEAR(at.seconds / step(0).seconds, 2.0, 0.01);
}

TEST(CostModel, PrefillIsComputeBound) {
  CostModel m(Llama2_7B(), RawH100());
  const ChunkShape prompt{0, 512};
  const StepCost s = m.Step({&prompt, 1});
  // Matrices: 2 x 512 x 6,476,005,376 + 2 x 1 row x 131,072,000 (logits of the last token).
  EXPECT_EQ(s.matmul_flops, 2.0 * 512 * 6'476'005'376.0 + 2.0 * 131'072'000);
  // Attention: 4 x 32 x 4096 x (1 + 2 + ... + 512 = 131,328).
  EXPECT_EQ(s.attention_flops, 4.0 * 32 * 4096 * 131'328);
  EXPECT_GT(s.flops() / s.bytes(), RawH100().ridge());
  EXPECT_DOUBLE_EQ(s.seconds, s.compute_seconds);
  EXPECT_NEAR(s.seconds, s.flops() / 989e12, 1e-9);
}

TEST(CostModel, TensorParallelSplitsWorkAndAddsAllReduces) {
  const ModelConfig c = Llama2_7B();
  CostModel one(c, RawH100(), 1), two(c, RawH100(), 2);
  const ChunkShape d{1000, 1};
  const StepCost s1 = one.Step({&d, 1}), s2 = two.Step({&d, 1});
  EXPECT_DOUBLE_EQ(s2.weight_bytes, s1.weight_bytes / 2);
  EXPECT_DOUBLE_EQ(s2.kv_read_bytes, s1.kv_read_bytes / 2);
  // Two all-reduces per layer of 4096 x 2 bytes: ring moves 2 (2 - 1) / 2 of it at 450 GB/s,
  // plus 10 us each: 64 x (8192 / 450e9 + 10e-6).
  EXPECT_NEAR(s2.comm_seconds, 64 * (8192.0 / 450e9 + 10e-6), 1e-12);
  EXPECT_EQ(s1.comm_seconds, 0);
  // Capacity: 80 GB x 0.9 = 72 GB a device, less the weights.
  EXPECT_NEAR(two.KvCapacityBytes(), 2 * (72e9 - s1.weight_bytes / 2), 1);
}

TEST(CostModel, KvTransferOverlapsTheLayers) {
  ModelConfig c = Llama2_7B();
  c.n_layers = 4;
  CostModel m(c, RawH100());
  // 10 tokens: 4 layers x 2 x 4096 x 2 bytes x 10 = 655,360 bytes, 163,840 per layer; on a
  // 327.68 MB/s link a layer takes 0.5 ms. Compute 4 ms: layers are ready at 1, 2, 3, 4 ms and
  // sent by 1.5, 2.5, 3.5, 4.5: the transfer ends 0.5 ms after the compute, not 2 ms.
  Link link{"test", 327.68e6, 0};
  double link_free = 0;
  EXPECT_NEAR(m.TransferDone(0, 4e-3, 10, link, &link_free), 4.5e-3, 1e-12);
  EXPECT_NEAR(link_free, 4.5e-3, 1e-12);
  // A slower link (2 ms a layer) is the bottleneck: 1 + 4 x 2 = 9 ms.
  link.bandwidth /= 4;
  link_free = 0;
  EXPECT_NEAR(m.TransferDone(0, 4e-3, 10, link, &link_free), 9e-3, 1e-12);
  // The link is busy until 9 ms: a second step's transfer queues behind.
  EXPECT_NEAR(m.TransferDone(4e-3, 4e-3, 10, link, &link_free), 17e-3, 1e-12);
  // Latency is paid per message (per layer): 1.5 ms a layer, ready at 1 ms: ends at 2.5, 4,
  // 5.5 and 7 ms.
  link = {"lat", 327.68e6, 1e-3};
  link_free = 0;
  EXPECT_NEAR(m.TransferDone(0, 4e-3, 10, link, &link_free), 7e-3, 1e-12);
}

TEST(CostModel, ProfilesRoundTripAndNameTheBadField) {
  for (const std::string& name : BuiltinProfileNames()) {
    auto p = LoadProfile(name);
    ASSERT_TRUE(p.ok()) << name;
    auto back = HardwareProfile::FromJson(p->ToJson());
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->ToJson(), p->ToJson());
  }
  EXPECT_EQ(LoadProfile("H100")->name, "h100-sxm");
  nlohmann::json j = LoadProfile("a100-80gb")->ToJson();
  j["mem_bandwidth"] = -1;
  auto bad = HardwareProfile::FromJson(j);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("mem_bandwidth"), std::string::npos);
  j = LoadProfile("l40s")->ToJson();
  j.erase("kv_link");
  EXPECT_NE(HardwareProfile::FromJson(j).status().message().find("kv_link"), std::string::npos);
  auto unknown = LoadProfile("tpu-v9");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("h100-sxm"), std::string::npos);
}

TEST(CostModel, InSituFieldsRoundTripAndSplitTheRoles) {
  HardwareProfile p = *LoadProfile("l40s");
  p.shared_host = true;
  p.request_jitter = 1e-3;
  p.decode_start_overhead = 2e-4;
  p.decode_start_jitter = 3e-4;
  p.step_jitter = 0.3;
  p.host_step_slots = 2;
  p.host_cores = 2;
  p.step_threads = 1.5;
  p.prefill_threads = 1;
  p.prefill_yield = 0.5;
  p.prefill_step_jitter = 0.4;
  p.sample_cpu = 1.5e-4;
  p.has_decode_factors = true;
  p.decode_factors = {0.1, 0.05, 0.2, 1e-5};
  p.has_prefill_factors = true;
  p.prefill_factors = {0.7, 0.2, 0.8, 0};
  auto back = HardwareProfile::FromJson(p.ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->ToJson(), p.ToJson());
  EXPECT_EQ(back->ForDecode().matmul_efficiency, 0.1);
  EXPECT_EQ(back->ForDecode().step_overhead, 1e-5);
  EXPECT_EQ(back->ForPrefill().attention_efficiency, 0.2);
  // A decode step costs what the decode factors say; prefill steps keep their own.
  const ModelConfig m = *RandomModelConfig("stories15M");
  const ChunkShape decode{100, 1};
  EXPECT_GT(CostModel(m, p.ForDecode()).Step({&decode, 1}).seconds,
            3 * CostModel(m, p.ForPrefill()).Step({&decode, 1}).seconds);
  // Without them, both roles are the profile's.
  HardwareProfile plain = *LoadProfile("l40s");
  EXPECT_EQ(plain.ForDecode().ToJson(), plain.ToJson());
  EXPECT_FALSE(plain.ToJson().contains("decode"));
  // Bad values name the field.
  nlohmann::json j = p.ToJson();
  j["decode"]["attention_efficiency"] = 0;
  EXPECT_NE(HardwareProfile::FromJson(j).status().message().find("decode.attention_efficiency"),
            std::string::npos);
  j = p.ToJson();
  j["prefill"] = 3;
  EXPECT_NE(HardwareProfile::FromJson(j).status().message().find("prefill"), std::string::npos);
  j = p.ToJson();
  j["host_step_slots"] = 0.5;
  EXPECT_NE(HardwareProfile::FromJson(j).status().message().find("host_step_slots"),
            std::string::npos);
  for (const char* key : {"host_cores", "step_threads", "prefill_threads"}) {
    j = p.ToJson();
    j[key] = key == std::string("host_cores") ? 0.5 : 3.0;  // under 1; more than the cores
    EXPECT_NE(HardwareProfile::FromJson(j).status().message().find(key), std::string::npos) << key;
  }
  j = p.ToJson();
  j["prefill_yield"] = 1.5;
  EXPECT_NE(HardwareProfile::FromJson(j).status().message().find("prefill_yield"),
            std::string::npos);
  for (const char* key : {"request_jitter", "sample_cpu"}) {
    j = p.ToJson();
    j[key] = -1;
    EXPECT_NE(HardwareProfile::FromJson(j).status().message().find(key), std::string::npos) << key;
  }
  // Profiles from before sample_cpu: none.
  j = p.ToJson();
  j.erase("sample_cpu");
  EXPECT_EQ(HardwareProfile::FromJson(j)->sample_cpu, 0);
}

TEST(CostModel, Links) {
  EXPECT_EQ(ParseLink("nvlink")->bandwidth, 450e9);
  auto custom = ParseLink("eth:12.5:20");
  ASSERT_TRUE(custom.ok());
  EXPECT_EQ(custom->bandwidth, 12.5e9);
  EXPECT_NEAR(custom->latency, 20e-6, 1e-15);
  for (const char* bad : {"carrier-pigeon", "x:0", "x:-1", "x:1:y", ":5"}) {
    EXPECT_EQ(ParseLink(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(CostModel, ModelsByNameOrFile) {
  auto m = ResolveModel("llama-3-8b");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->n_kv_heads, 8);
  EXPECT_EQ(m->vocab_size, 128256);
  EXPECT_EQ(ResolveModel("STORIES15M")->dim, 288);
  auto unknown = ResolveModel("gpt-5");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("--model"), std::string::npos);
  auto file = ResolveModel(std::string(TANDEM_SHARED_DIR) + "/models/stories260K/stories260K.bin");
  if (file.ok()) {  // the llama2.c header, when the model is present
    EXPECT_EQ(file->dim, 64);
  }
}

TEST(CostModel, GqaShrinksTheKvCache) {
  // Llama-3-8B: 8 KV heads of 128: 2 x 32 x 1024 x 2 = 131,072 bytes a token, a quarter of
  // Llama-2-7B's.
  CostModel m(*RandomModelConfig("Llama-3-8B"), RawH100());
  EXPECT_EQ(m.KvBytesPerToken(), 131'072.0);
}

TEST(Calibrate, FitRecoversKnownFactors) {
  // Samples made by the cost model itself with known factors: the fit must give them back.
  HardwareProfile truth = RawH100();
  truth.name = "synthetic";
  truth.overlap = false;
  truth.step_overhead = 0.25e-3;
  truth.matmul_efficiency = 0.6;
  truth.attention_efficiency = 0.2;
  truth.bandwidth_efficiency = 0.8;
  std::vector<StepSample> samples;
  const ModelConfig c = *RandomModelConfig("stories110M");
  for (int tokens : {16, 128, 512}) {
    for (int seqs : {1, 4}) {
      for (int context : {0, 300}) {
        StepSample s;
        s.config = c;
        s.weight_bytes = 2;
        s.batch.assign(seqs, ChunkShape{context, tokens});
        HardwareProfile t = truth;
        t.weight_bytes = 2;
        s.seconds = CostModel(c, t).Step(s.batch).seconds;
        samples.push_back(s);
      }
    }
  }
  for (int seqs : {1, 8, 64}) {
    StepSample s;
    s.config = c;
    s.weight_bytes = 2;
    s.batch.assign(seqs, ChunkShape{500, 1});
    HardwareProfile t = truth;
    t.weight_bytes = 2;
    s.seconds = CostModel(c, t).Step(s.batch).seconds;
    samples.push_back(s);
  }
  HardwareProfile base = truth;
  base.step_overhead = 0;
  base.matmul_efficiency = base.attention_efficiency = base.bandwidth_efficiency = 1;
  nlohmann::json report;
  auto fit = FitProfile(base, samples, &report);
  ASSERT_TRUE(fit.ok()) << fit.status();
  EXPECT_NEAR(fit->step_overhead, 0.25e-3, 1e-9);
  EXPECT_NEAR(fit->matmul_efficiency, 0.6, 1e-6);
  EXPECT_NEAR(fit->attention_efficiency, 0.2, 1e-6);
  EXPECT_NEAR(fit->bandwidth_efficiency, 0.8, 1e-6);
  EXPECT_LT(report["mean_abs_error"].get<double>(), 1e-9);
  EXPECT_FALSE(FitProfile(base, {samples[0]}, nullptr).ok());  // too few samples

  // Weights: half the samples made 30% slower disagree with the rest; the fit leans to the
  // side that weighs more.
  std::vector<StepSample> mixed = samples;
  for (size_t i = 0; i < mixed.size(); i += 2) mixed[i].seconds *= 1.3;
  auto error_on = [&](const HardwareProfile& p, size_t parity) {
    double e = 0;
    for (size_t i = parity; i < samples.size(); i += 2) {
      HardwareProfile q = p;
      q.weight_bytes = 2;
      e += std::abs(CostModel(c, q).Step(mixed[i].batch).seconds / mixed[i].seconds - 1);
    }
    return e;
  };
  auto even = FitProfile(base, mixed, nullptr);
  for (size_t i = 0; i < mixed.size(); i += 2) mixed[i].weight = 10;
  auto heavy = FitProfile(base, mixed, nullptr);
  ASSERT_TRUE(even.ok() && heavy.ok());
  EXPECT_LT(error_on(*heavy, 0), 0.5 * error_on(*even, 0));
  EXPECT_GT(error_on(*heavy, 1), error_on(*even, 1));
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

// The device run the shipped h200 profile was fitted to (../shared/gpu/h200-2026-12-04).
nlohmann::json H200Run() {
  return ReadJson(testing::SourceDir() + "/tests/fixtures/planner/h200_cuda_model_bench.json");
}

TEST(MeasuredProfile, TheShippedH200IsTheFitOfItsDeviceRun) {
  auto shipped = LoadProfile("h200");
  ASSERT_TRUE(shipped.ok()) << shipped.status();
  EXPECT_NE(shipped->provenance.find("H200"), std::string::npos) << shipped->provenance;
  EXPECT_NE(shipped->provenance.find("2026-12-04"), std::string::npos) << shipped->provenance;
  // The file in the repository and the profile compiled in are the same.
  const nlohmann::json file = ReadJson(testing::SourceDir() + "/planner/profiles/h200.json");
  EXPECT_EQ(file, shipped->ToJson());

  // Fitted again from the device run on the datasheet's figures, it comes out the same.
  const nlohmann::json run = H200Run();
  ASSERT_TRUE(run.is_object());
  auto datasheet = LoadProfile("h200-datasheet");
  ASSERT_TRUE(datasheet.ok()) << datasheet.status();
  EXPECT_TRUE(datasheet->provenance.empty());
  nlohmann::json report;
  auto fit = ProfileFromDeviceBench(*datasheet, run, shipped->provenance, &report);
  ASSERT_TRUE(fit.ok()) << fit.status();
  fit->name = "h200";
  const nlohmann::json fresh = fit->ToJson();
  for (const auto& [key, value] : file.items()) {
    if (value.is_number_float()) {
      EXPECT_NEAR(fresh[key].get<double>(), value.get<double>(),
                  1e-9 * std::abs(value.get<double>()))
          << key;
    } else {
      EXPECT_EQ(fresh[key], value) << key;
    }
  }
  // It reproduces every measured step: within 6% each, 3% on average.
  ASSERT_EQ(report["samples"].size(), run["decode"].size() + run["prefill"].size());
  for (const auto& row : report["samples"]) {
    EXPECT_LT(std::abs(row["error"].get<double>()), 0.06) << row.dump();
  }
  EXPECT_LT(report["mean_abs_error"].get<double>(), 0.03);
  // And the planner's cost model prices the measured decode step as measured (not the
  // datasheet's typical efficiencies, which put it at a third less).
  auto config = RandomModelConfig("Llama-3-8B");
  ASSERT_TRUE(config.ok());
  HardwareProfile f32_kv = *shipped;
  f32_kv.kv_bytes = 4;  // what the run used
  const std::vector<ChunkShape> one = {ChunkShape{512, 1, 1}};
  const double b1 = CostModel(*config, f32_kv).Step(one).seconds;
  EXPECT_NEAR(b1, 5.6788e-3, 0.06 * 5.6788e-3);
  HardwareProfile sheet_f32 = *datasheet;
  sheet_f32.kv_bytes = 4;
  EXPECT_LT(CostModel(*config, sheet_f32).Step(one).seconds, 0.75 * 5.6788e-3);
}

TEST(MeasuredProfile, ProvenanceComesFromTheRunOrTheCaller) {
  nlohmann::json run = H200Run();
  auto base = LoadProfile("h200-datasheet");
  ASSERT_TRUE(base.ok());
  // The fixture predates the bench's provenance fields: without them the caller must say.
  auto none = ProfileFromDeviceBench(*base, run, "", nullptr);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("--provenance"), std::string::npos);
  run["device"] = "NVIDIA H200";
  run["date"] = "2026-12-04";
  run["commit"] = "abc1234";
  auto named = ProfileFromDeviceBench(*base, run, "", nullptr);
  ASSERT_TRUE(named.ok()) << named.status();
  EXPECT_EQ(named->provenance,
            "NVIDIA H200, 2026-12-04, commit abc1234: bench/cuda_model_bench (32 layers, context "
            "512, f32 KV)");
  EXPECT_EQ(named->kv_bytes, base->kv_bytes) << "the profile keeps the deployment's KV dtype";
  EXPECT_FALSE(named->overlap);
  // A profile written and read back keeps its provenance.
  auto back = HardwareProfile::FromJson(named->ToJson());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->provenance, named->provenance);
  nlohmann::json bad_provenance = named->ToJson();
  bad_provenance["provenance"] = 7;
  EXPECT_FALSE(HardwareProfile::FromJson(bad_provenance).ok());
}

TEST(MeasuredProfile, MalformedRunsAreRefusedByField) {
  auto base = LoadProfile("h200-datasheet");
  ASSERT_TRUE(base.ok());
  struct Case {
    std::function<void(nlohmann::json&)> edit;
    std::string needle;
  };
  const std::vector<Case> cases = {
      {[](nlohmann::json& j) { j.erase("layers"); }, "\"layers\""},
      {[](nlohmann::json& j) { j["context"] = -5; }, "\"context\""},
      {[](nlohmann::json& j) { j["decode"] = "fast"; }, "\"decode\""},
      {[](nlohmann::json& j) { j.erase("prefill"); }, "\"prefill\""},
      {[](nlohmann::json& j) { j["decode"][0]["step_ms"] = 0; }, "\"step_ms\""},
      {[](nlohmann::json& j) { j["prefill"][1].erase("tokens"); }, "\"tokens\""},
      {[](nlohmann::json& j) { j["kv_dtype"] = "int4"; }, "kv_dtype"},
      {[](nlohmann::json& j) {
         j["decode"] = nlohmann::json::array();
         j["prefill"] = {j["prefill"][0]};
       },
       "at least 4"},
  };
  for (const Case& c : cases) {
    nlohmann::json run = H200Run();
    c.edit(run);
    auto p = ProfileFromDeviceBench(*base, run, "test", nullptr);
    ASSERT_FALSE(p.ok()) << run.dump();
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    EXPECT_NE(p.status().message().find(c.needle), std::string::npos) << p.status();
  }
}

}  // namespace
}  // namespace tandem::planner
