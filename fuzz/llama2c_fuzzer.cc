// Fuzzes the llama2.c checkpoint parser (engine/model.h ParseLlama2cCheckpoint). The input is
// tried as a whole file; then its first 28 bytes are taken as the header of a checkpoint padded
// (or cut) to the size that header describes, when that is small, so that headers which pass
// validation go on to the weight layout. Every weight the parser accepts is read at both ends.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "engine/model.h"
#include "formats/mapped_file.h"

namespace {

constexpr size_t kMaxPaddedBytes = 4 << 20;

void Touch(const tandem::MappedFile& file, const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  if (bytes <= 0) return;
  if (c < file.data() || c + bytes > file.data() + file.size()) __builtin_trap();
  volatile char sink = c[0];
  sink = c[bytes - 1];
  (void)sink;
}

void Check(const std::string& bytes) {
  auto file = tandem::MappedFile::FromString("fuzz.bin", bytes);
  auto loaded = tandem::ParseLlama2cCheckpoint(file);
  if (!loaded.ok()) return;
  const auto& [c, w] = *loaded;
  if (!c.Validate().ok()) __builtin_trap();
  auto touch_ref = [&](const tandem::WeightRef& r) { Touch(*file, r.data, r.rows * r.cols * 4); };
  touch_ref(w.token_embedding);
  touch_ref(w.classifier);
  Touch(*file, w.final_norm, int64_t{c.dim} * 4);
  for (const auto& l : w.layers) {
    for (const auto* r : l.Matrices()) touch_ref(*r);
    Touch(*file, l.attn_norm, int64_t{c.dim} * 4);
    Touch(*file, l.ffn_norm, int64_t{c.dim} * 4);
  }
}

// The file size run.c's layout gives the header, or 0 when it is nonsense or too big.
size_t DescribedSize(const int32_t h[7]) {
  for (int i = 0; i < 7; ++i) {
    if (i != 5 && (h[i] <= 0 || h[i] > (1 << 20))) return 0;
  }
  if (h[5] == 0 || h[5] == INT32_MIN || h[3] == 0 || h[4] == 0) return 0;
  using Wide = unsigned __int128;
  const Wide dim = h[0], hid = h[1], L = h[2], vocab = h[5] > 0 ? h[5] : -int64_t{h[5]};
  const Wide head = dim / h[3], q = head * h[3], kv = head * h[4], seq = h[6];
  const Wide floats = vocab * dim + L * dim * 2 + L * dim * q * 2 + 2 * L * kv * dim +
                      3 * L * dim * hid + dim + seq * head + (h[5] > 0 ? 0 : vocab * dim);
  const Wide bytes = 28 + 4 * floats;
  return bytes > kMaxPaddedBytes ? 0 : static_cast<size_t>(bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  Check(raw);
  if (size < 28) return 0;
  int32_t h[7];
  std::memcpy(h, data, sizeof(h));
  const size_t want = DescribedSize(h);
  if (want == 0 || want == size) return 0;
  std::string padded = raw.substr(0, want);
  padded.resize(want, '\0');
  Check(padded);
  return 0;
}
