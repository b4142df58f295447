// Writing Hugging Face model directories: conversion from llama2.c checkpoints and random-weight
// models of realistic shapes for benchmarks.
#ifndef TANDEM_ENGINE_LOADERS_MODEL_WRITER_H_
#define TANDEM_ENGINE_LOADERS_MODEL_WRITER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model_config.h"

namespace tandem {

// Writes `out_dir`/config.json and model.safetensors (float32) from a llama2.c checkpoint, with
// the q/k row permutation that makes Hugging Face's rotate-half RoPE equal llama2.c's
// interleaved one. The converted model gives the same logits through the HF loader.
absl::Status ConvertLlama2cToHf(const std::string& checkpoint, const std::string& out_dir);

// Writes `out_dir`/config.json, model.safetensors (float32: every tensor dequantized exactly),
// tokenizer.json and tokenizer_config.json (with the chat template) from a GGUF file. The
// directory gives the same logits through the HF loader as the GGUF file with --dtype f32.
absl::Status ConvertGgufToHf(const std::string& gguf_path, const std::string& out_dir);

// Names accepted by RandomModelConfig: stories15M, stories110M, TinyLlama-1.1B, Llama-2-7B,
// Llama-3-8B, and the mixtures of experts Mixtral-8x7B and Qwen3-30B-A3B (and stories260K).
std::vector<std::string> RandomModelShapes();
absl::StatusOr<ModelConfig> RandomModelConfig(const std::string& shape);

// Writes a model of `config`'s shape with random weights (deterministic in `seed`): linear
// weights uniform with std 1/sqrt(fan_in), norms 1.
absl::Status WriteRandomModel(const ModelConfig& config, DType dtype, uint64_t seed,
                              const std::string& out_dir);

}  // namespace tandem

#endif  // TANDEM_ENGINE_LOADERS_MODEL_WRITER_H_
