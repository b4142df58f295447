// Fuzzes the KV transfer wire format (kv_transfer/wire.h) and what a receiver does with a frame
// that decodes (kv_transfer/kv_pack.h ScatterKv into a small paged cache). Checksums would stop
// almost every mutation at the first check, so each input is decoded twice: as given, and with
// the magic, header CRC and payload CRC made right. A header that decodes must encode back to the
// same header bytes. The input as text also goes through the endpoint parsers.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/kv/kv_cache.h"
#include "engine/model_config.h"
#include "kv_transfer/kv_pack.h"
#include "kv_transfer/transport_common.h"
#include "kv_transfer/wire.h"
#include "lib/crc32c/crc32c.h"

namespace {

// 2 layers, width 8 (2 KV heads x 4), 4 blocks of 4 tokens, in `dtype` (f32, bf16 or fp8).
tandem::KvCache* MakeCache(tandem::DType dtype) {
  {
    tandem::ModelConfig c;
    c.dim = 8;
    c.hidden_dim = 8;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_heads = 2;
    c.head_dim = 4;
    c.vocab_size = 8;
    c.max_seq_len = 16;
    auto kv = tandem::KvCache::Create(c, /*num_blocks=*/4, /*block_size=*/4, 0, dtype);
    if (!kv.ok()) __builtin_trap();
    return new tandem::KvCache(*std::move(kv));
  }
}

// The receiver's cache: usually the one whose dtype the frame names (so the frame reaches the
// copy), sometimes another (the dtype refusal).
tandem::KvCache& Cache(tandem::DType frame_dtype, uint8_t pick) {
  static tandem::KvCache* const caches[] = {MakeCache(tandem::DType::kF32),
                                            MakeCache(tandem::DType::kBF16),
                                            MakeCache(tandem::DType::kFp8E4M3)};
  if (pick % 4 != 0) {
    for (tandem::KvCache* c : caches) {
      if (c->dtype() == frame_dtype) return *c;
    }
  }
  return *caches[pick % 3];
}

void Put32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + i] = static_cast<char>(v >> (8 * i));
}

void Decode(const std::string& bytes, uint64_t max_frame) {
  const std::span<const char> span(bytes.data(), bytes.size());
  tandem::KvFrameHeader raw;
  auto header = tandem::DecodeKvFrameHeader(span, max_frame, &raw);
  if (header.ok()) {
    std::string again(tandem::kKvFrameHeaderBytes, '\0');
    tandem::EncodeKvFrameHeader(
        *header, std::span<char, tandem::kKvFrameHeaderBytes>(again.data(), again.size()));
    if (std::memcmp(again.data(), bytes.data(), again.size()) != 0) __builtin_trap();
  }
  auto frame = tandem::DecodeKvFrame(span, max_frame);
  if (!frame.ok()) return;
  if (frame->payload.size() != frame->header.payload_length) __builtin_trap();
  if (frame->header.kind == tandem::KvFrameKind::kAck) {
    (void)tandem::KvAckStatus(frame->header, frame->payload);
    return;
  }
  // The receiver's block table: the last payload byte picks one of a few shapes.
  static const std::vector<int> kTables[] = {{0, 1, 2, 3}, {3, 2}, {1}, {}, {0, 4, -1, 2}};
  const uint8_t pick = frame->payload.empty() ? 0 : frame->payload.back();
  const std::vector<int>& table = kTables[pick % std::size(kTables)];
  (void)tandem::ScatterKv(frame->payload, frame->header.chunk, table,
                          &Cache(frame->header.chunk.dtype, pick / 8));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  (void)tandem::ParseKvEndpoint(bytes);
  (void)tandem::ParseTcpAddress(bytes);
  const uint64_t max_frame = 1 << 16;
  Decode(bytes, max_frame);
  if (size < tandem::kKvFrameHeaderBytes) return 0;
  std::string fixed = bytes;
  Put32(fixed, 0, tandem::kKvWireMagic);
  const std::span<const char> payload(fixed.data() + tandem::kKvFrameHeaderBytes,
                                      fixed.size() - tandem::kKvFrameHeaderBytes);
  Put32(fixed, 80, tandem::Crc32c(payload));
  Put32(fixed, 84, tandem::Crc32cExtend(0, fixed.data(), 84));
  Decode(fixed, max_frame);
  return 0;
}
