// Fuzzes the Hugging Face config.json parser (engine/model_config.h FromHfJson) and the
// checks a loaded config must then pass: an accepted config has consistent, positive sizes whose
// products used by the loader do not overflow, and it survives a ToHfJson round trip.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string json(reinterpret_cast<const char*>(data), size);
  auto config = tandem::ModelConfig::FromHfJson(json);
  if (!config.ok()) return 0;
  if (!config->Validate().ok()) return 0;
  // Validate promises sizes the engine can multiply in int.
  const int64_t q = int64_t{config->n_heads} * config->head_dim;
  const int64_t kv = int64_t{config->n_kv_heads} * config->head_dim;
  if (q != config->q_dim() || kv != config->kv_dim()) __builtin_trap();
  if (config->head_dim <= (1 << 16)) {
    volatile float f = 0;
    for (float x : config->RopeInvFreq()) f = f + x;
  }
  auto again = tandem::ModelConfig::FromHfJson(config->ToHfJson());
  if (!again.ok()) __builtin_trap();
  if (again->dim != config->dim || again->n_layers != config->n_layers ||
      again->head_dim != config->head_dim || again->vocab_size != config->vocab_size) {
    __builtin_trap();
  }
  return 0;
}
