#include "kv_transfer/wire.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_format.h"
#include "lib/crc32c/crc32c.h"

namespace tandem {
namespace {

constexpr size_t kCapabilityOffset = 64;
constexpr size_t kPayloadCrcOffset = 80;
constexpr size_t kHeaderCrcOffset = 84;

// Little-endian field access; the header is never read through a struct cast, so a garbage
// buffer cannot trip alignment or padding assumptions.
template <typename T>
void Put(char* base, size_t offset, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    base[offset + i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
  }
}
template <typename T>
T Get(const char* base, size_t offset) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= uint64_t{static_cast<unsigned char>(base[offset + i])} << (8 * i);
  }
  return static_cast<T>(v);
}

bool KnownDType(uint8_t d) {
  return d == static_cast<uint8_t>(DType::kF32) || d == static_cast<uint8_t>(DType::kF16) ||
         d == static_cast<uint8_t>(DType::kBF16) || d == static_cast<uint8_t>(DType::kFp8E4M3);
}

absl::Status Bad(std::string_view field, std::string_view why) {
  return absl::InvalidArgumentError(absl::StrFormat("kv frame: %s %s", field, why));
}

}  // namespace

absl::StatusOr<uint64_t> KvChunkPayloadBytes(const KvChunkHeader& h, uint64_t max_payload_bytes) {
  if (!KnownDType(static_cast<uint8_t>(h.dtype))) {
    return Bad("dtype", absl::StrFormat("%d is unknown", static_cast<int>(h.dtype)));
  }
  if (h.token_count == 0) return Bad("token_count", "is 0");
  if (h.width == 0) return Bad("width", "is 0");
  const bool fp8 = h.dtype == DType::kFp8E4M3;
  if (fp8 && (h.scale_groups == 0 || h.width % h.scale_groups != 0)) {
    return Bad("scale_groups",
               absl::StrFormat("%d does not divide width %d", h.scale_groups, h.width));
  }
  if (!fp8 && h.scale_groups != 0) return Bad("scale_groups", "must be 0 outside fp8");
  if (uint64_t{h.token_start} + h.token_count > std::numeric_limits<uint32_t>::max()) {
    return Bad("token_start", "+ token_count overflows uint32");
  }
  // token_count, width < 2^32 and dtype size <= 4: the product fits in 2^67, so compute the
  // first factor pair in 64 bits and check the rest against the limit by division.
  const uint64_t rows = 2 * uint64_t{h.token_count};
  const uint64_t row_bytes = uint64_t{h.width} * DTypeSize(h.dtype);
  const uint64_t scale_bytes = fp8 ? uint64_t{2} * h.scale_groups * 4 : 0;
  if (row_bytes > max_payload_bytes / rows || rows * row_bytes > max_payload_bytes - scale_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("kv frame: %d tokens x width %d exceed the %d-byte frame limit",
                        h.token_count, h.width, max_payload_bytes));
  }
  return rows * row_bytes + scale_bytes;
}

void EncodeKvFrameHeader(const KvFrameHeader& h, std::span<char, kKvFrameHeaderBytes> out) {
  char* b = out.data();
  const bool data = h.kind == KvFrameKind::kData;
  Put<uint32_t>(b, 0, kKvWireMagic);
  Put<uint16_t>(b, 4, kKvWireVersion);
  Put<uint8_t>(b, 6, static_cast<uint8_t>(h.kind));
  Put<uint8_t>(b, 7, data ? static_cast<uint8_t>(h.chunk.dtype) : 0);
  Put<uint64_t>(b, 8, h.seq);
  Put<uint64_t>(b, 16, h.chunk.request_id);
  Put<uint64_t>(b, 24, h.chunk.lease_id);
  Put<uint32_t>(b, 32, h.chunk.generation);
  Put<uint32_t>(b, 36, h.chunk.layer);
  Put<uint32_t>(b, 40, h.chunk.token_start);
  Put<uint32_t>(b, 44, h.chunk.token_count);
  Put<uint32_t>(b, 48, data ? h.chunk.width : 0);
  Put<uint32_t>(b, 52, data ? h.chunk.scale_groups : static_cast<uint32_t>(h.status));
  Put<uint64_t>(b, 56, h.payload_length);
  std::memset(b + kCapabilityOffset, 0, kKvCapabilityBytes);
  if (data) {
    std::memcpy(b + kCapabilityOffset, h.chunk.capability.data(),
                std::min(h.chunk.capability.size(), kKvCapabilityBytes));
  }
  Put<uint32_t>(b, kPayloadCrcOffset, h.payload_crc);
  Put<uint32_t>(b, kHeaderCrcOffset, Crc32cExtend(0, b, kHeaderCrcOffset));
}

absl::StatusOr<KvFrameHeader> DecodeKvFrameHeader(std::span<const char> bytes,
                                                  uint64_t max_frame_bytes, KvFrameHeader* raw) {
  if (bytes.size() < kKvFrameHeaderBytes) {
    return Bad("header",
               absl::StrFormat("truncated: %d of %d bytes", bytes.size(), kKvFrameHeaderBytes));
  }
  const char* b = bytes.data();
  if (Get<uint32_t>(b, 0) != kKvWireMagic) return absl::DataLossError("kv frame: bad magic");
  if (Get<uint32_t>(b, kHeaderCrcOffset) != Crc32cExtend(0, b, kHeaderCrcOffset)) {
    return absl::DataLossError("kv frame: header checksum mismatch");
  }
  if (const uint16_t v = Get<uint16_t>(b, 4); v != kKvWireVersion) {
    return Bad("version", absl::StrFormat("%d is not supported (want %d)", v, kKvWireVersion));
  }
  KvFrameHeader h;
  const uint8_t kind = Get<uint8_t>(b, 6);
  if (kind != static_cast<uint8_t>(KvFrameKind::kData) &&
      kind != static_cast<uint8_t>(KvFrameKind::kAck)) {
    return Bad("kind", absl::StrFormat("%d is unknown", kind));
  }
  h.kind = static_cast<KvFrameKind>(kind);
  const uint8_t dtype = Get<uint8_t>(b, 7);
  h.seq = Get<uint64_t>(b, 8);
  h.chunk.request_id = Get<uint64_t>(b, 16);
  h.chunk.lease_id = Get<uint64_t>(b, 24);
  h.chunk.generation = Get<uint32_t>(b, 32);
  h.chunk.layer = Get<uint32_t>(b, 36);
  h.chunk.token_start = Get<uint32_t>(b, 40);
  h.chunk.token_count = Get<uint32_t>(b, 44);
  h.chunk.width = Get<uint32_t>(b, 48);
  const uint32_t status = Get<uint32_t>(b, 52);  // DATA: scale groups
  h.payload_length = Get<uint64_t>(b, 56);
  if (h.kind == KvFrameKind::kData)
    h.chunk.capability.assign(b + kCapabilityOffset, kKvCapabilityBytes);
  h.payload_crc = Get<uint32_t>(b, kPayloadCrcOffset);
  if (raw != nullptr) *raw = h;

  if (h.kind == KvFrameKind::kData) {
    if (!KnownDType(dtype)) return Bad("dtype", absl::StrFormat("%d is unknown", dtype));
    h.chunk.dtype = static_cast<DType>(dtype);
    h.chunk.scale_groups = status;
    absl::StatusOr<uint64_t> want = KvChunkPayloadBytes(h.chunk, max_frame_bytes);
    if (!want.ok()) return want.status();
    if (h.payload_length != *want) {
      return Bad(
          "payload_length",
          absl::StrFormat("is %d, want 2 * %d tokens * width %d * %d bytes = %d", h.payload_length,
                          h.chunk.token_count, h.chunk.width, DTypeSize(h.chunk.dtype), *want));
    }
  } else {
    if (dtype != 0) return Bad("dtype", "must be 0 in an ACK frame");
    if (h.chunk.width != 0) return Bad("width", "must be 0 in an ACK frame");
    for (size_t i = 0; i < kKvCapabilityBytes; ++i) {
      if (b[kCapabilityOffset + i] != 0) return Bad("capability", "must be 0 in an ACK frame");
    }
    // absl::StatusCode values are 0..16.
    if (status > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
      return Bad("status", absl::StrFormat("%d is not a status code", status));
    }
    h.status = static_cast<absl::StatusCode>(status);
    if (h.payload_length > kMaxAckMessageBytes) {
      return Bad("payload_length", absl::StrFormat("%d exceeds the %d-byte ACK message limit",
                                                   h.payload_length, kMaxAckMessageBytes));
    }
  }
  return h;
}

std::string EncodeKvDataFrame(uint64_t seq, const KvChunkHeader& chunk,
                              std::span<const char> payload) {
  KvFrameHeader h;
  h.kind = KvFrameKind::kData;
  h.seq = seq;
  h.chunk = chunk;
  h.payload_length = payload.size();
  h.payload_crc = Crc32c(payload);
  std::string out(kKvFrameHeaderBytes + payload.size(), '\0');
  EncodeKvFrameHeader(h, std::span<char, kKvFrameHeaderBytes>(out.data(), kKvFrameHeaderBytes));
  if (!payload.empty())
    std::memcpy(out.data() + kKvFrameHeaderBytes, payload.data(), payload.size());
  return out;
}

std::string EncodeKvAckFrame(uint64_t seq, const KvChunkHeader& chunk, const absl::Status& status) {
  absl::string_view message = status.message();
  if (message.size() > kMaxAckMessageBytes) message = message.substr(0, kMaxAckMessageBytes);
  KvFrameHeader h;
  h.kind = KvFrameKind::kAck;
  h.seq = seq;
  h.chunk = chunk;
  h.status = status.code();
  h.payload_length = message.size();
  h.payload_crc = Crc32c(std::span<const char>(message.data(), message.size()));
  std::string out(kKvFrameHeaderBytes, '\0');
  EncodeKvFrameHeader(h, std::span<char, kKvFrameHeaderBytes>(out.data(), kKvFrameHeaderBytes));
  out.append(message.data(), message.size());
  return out;
}

absl::StatusOr<KvFrame> DecodeKvFrame(std::span<const char> bytes, uint64_t max_frame_bytes) {
  absl::StatusOr<KvFrameHeader> h = DecodeKvFrameHeader(bytes, max_frame_bytes);
  if (!h.ok()) return h.status();
  const uint64_t rest = bytes.size() - kKvFrameHeaderBytes;
  if (rest != h->payload_length) {
    return Bad("payload", absl::StrFormat("has %d bytes, header says %d", rest, h->payload_length));
  }
  KvFrame f{*h, bytes.subspan(kKvFrameHeaderBytes)};
  if (Crc32c(f.payload) != h->payload_crc) {
    return absl::DataLossError("kv frame: payload checksum mismatch");
  }
  return f;
}

absl::Status KvAckStatus(const KvFrameHeader& h, std::span<const char> payload) {
  if (h.status == absl::StatusCode::kOk) return absl::OkStatus();
  return absl::Status(h.status, absl::string_view(payload.data(), payload.size()));
}

}  // namespace tandem
