// The KV transfer wire format. Every frame is a fixed 88-byte little-endian header followed by
// `payload_length` bytes:
//
//   offset size field
//        0    4 magic "TKV1"
//        4    2 version (2)
//        6    1 kind (1 = DATA, 2 = ACK)
//        7    1 dtype (DATA: kernels/dtype.h DType; ACK: 0)
//        8    8 seq: chosen by the sender, echoed by the ACK that answers the DATA frame
//       16    8 request id
//       24    8 lease id
//       32    4 lease generation
//       36    4 layer
//       40    4 token_start
//       44    4 token_count
//       48    4 width (n_kv_heads * head_dim; ACK: 0)
//       52    4 DATA: scale groups (fp8: the KV heads, whose scales follow the rows; else 0);
//                ACK: status code (absl::StatusCode)
//       56    8 payload length in bytes
//       64   16 lease capability (DATA: the KvTarget's; ACK: zeros, never echoed)
//       80    4 CRC32C of the payload
//       84    4 CRC32C of bytes [0, 84)
//
// DATA payload: K rows [token_count, width] then V rows [token_count, width] of `dtype` (the
// cache dtype, as stored), then for fp8 the scales [2 (K, V), scale groups] as float32, so the
// unit on the wire is (lease, layer, token range) independent of either side's block size.
// ACK payload: the status message (UTF-8, at most kMaxAckMessageBytes); the other fields echo
// the DATA frame being answered.
#ifndef TANDEM_KV_TRANSFER_WIRE_H_
#define TANDEM_KV_TRANSFER_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/dtype.h"

namespace tandem {

inline constexpr uint32_t kKvWireMagic = 0x31564B54u;  // "TKV1" read as little-endian
inline constexpr uint16_t kKvWireVersion = 2;
inline constexpr size_t kKvFrameHeaderBytes = 88;
inline constexpr size_t kKvCapabilityBytes = 16;
inline constexpr size_t kMaxAckMessageBytes = 1024;
inline constexpr uint64_t kDefaultMaxFrameBytes = uint64_t{256} << 20;

enum class KvFrameKind : uint8_t { kData = 1, kAck = 2 };

// Names one chunk of KV: a token range of one layer of one lease.
struct KvChunkHeader {
  uint64_t request_id = 0;
  uint64_t lease_id = 0;
  uint32_t generation = 0;
  uint32_t layer = 0;
  uint32_t token_start = 0;
  uint32_t token_count = 0;
  DType dtype = DType::kF32;
  uint32_t width = 0;         // elements per token row of K (and of V)
  uint32_t scale_groups = 0;  // fp8: KV heads (a scale each for K and V); 0 for other dtypes
  // The lease's capability (kKvCapabilityBytes; shorter is zero-padded on the wire).
  std::string capability;
};

// Payload bytes of a chunk: 2 (K and V) * token_count * width * DTypeSize(dtype), plus for fp8
// 2 * scale_groups float32 scales; INVALID_ARGUMENT if a field is out of range (zero count or
// width, unknown dtype, a token range that overflows uint32, scale groups that do not divide the
// width or appear outside fp8), RESOURCE_EXHAUSTED if larger than `max_payload_bytes`.
absl::StatusOr<uint64_t> KvChunkPayloadBytes(const KvChunkHeader& h, uint64_t max_payload_bytes);

struct KvFrameHeader {
  KvFrameKind kind = KvFrameKind::kData;
  uint64_t seq = 0;
  KvChunkHeader chunk;  // ACK: echoes request, lease, generation, layer, token range
  absl::StatusCode status = absl::StatusCode::kOk;  // ACK only
  uint64_t payload_length = 0;
  uint32_t payload_crc = 0;
};

// Writes the 88-byte header (computing the header CRC) to `out`.
void EncodeKvFrameHeader(const KvFrameHeader& h, std::span<char, kKvFrameHeaderBytes> out);

// Parses and validates a header. `max_frame_bytes` bounds the payload of a DATA frame.
// DATA_LOSS for a bad magic or header CRC (the byte stream can no longer be trusted),
// INVALID_ARGUMENT naming the field for any other malformed field, RESOURCE_EXHAUSTED for a
// payload over the limit. A DATA header's payload_length must equal KvChunkPayloadBytes.
// When `raw` is given and the magic and header CRC are intact, it receives the fields as read
// even if validation fails, so a receiver can answer the frame's seq with the error.
absl::StatusOr<KvFrameHeader> DecodeKvFrameHeader(std::span<const char> bytes,
                                                  uint64_t max_frame_bytes = kDefaultMaxFrameBytes,
                                                  KvFrameHeader* raw = nullptr);

// Whole frames, for tests, fuzzing and in-memory transports; sockets write the header and the
// payload separately to avoid a copy. EncodeKvDataFrame fills payload_length and payload_crc.
std::string EncodeKvDataFrame(uint64_t seq, const KvChunkHeader& chunk,
                              std::span<const char> payload);
std::string EncodeKvAckFrame(uint64_t seq, const KvChunkHeader& chunk, const absl::Status& status);

struct KvFrame {
  KvFrameHeader header;
  std::span<const char> payload;  // points into the decoded buffer
};
// Decodes one frame that must fill `bytes` exactly; also checks the payload CRC (DATA_LOSS).
absl::StatusOr<KvFrame> DecodeKvFrame(std::span<const char> bytes,
                                      uint64_t max_frame_bytes = kDefaultMaxFrameBytes);

// The status an ACK frame carries: its code and its payload as the message.
absl::Status KvAckStatus(const KvFrameHeader& h, std::span<const char> payload);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_WIRE_H_
