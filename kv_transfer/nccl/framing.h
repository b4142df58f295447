// How one layer of a KV transfer travels over an NCCL communicator. NCCL moves raw bytes with
// no message boundaries, so the two sides must post matching Send/Recv operations in the same
// order. Each layer is two messages, posted by the sender in one group (ncclGroupStart/End):
//
//   1. the 72-byte kv_transfer/wire.h DATA header: request, lease, generation, layer, token
//      range, dtype, width, payload length, payload CRC32C (or 0 when checksums are off), and
//      `seq`, the layer's 0-based index in the communicator's stream (a receiver seeing another
//      seq knows the stream is out of step);
//   2. the payload, exactly KvChunkPayloadBytes(header): K [token_count, width] then
//      V [token_count, width] of `dtype`.
//
// The receiver posts a 72-byte Recv, decodes the header, asks its sink where the payload goes
// (a device staging buffer on a GPU), then posts a Recv of payload_length bytes. There is no
// ACK over NCCL: a send completes when the receiver has the bytes; the sink's verdict reaches
// the prefill through the decode worker's gRPC stream, as for the other transports.
//
// Payload checksums need the payload in host memory. With device buffers the transport is
// configured with payload checksums off (both sides must agree); the header is always checked.
#ifndef TANDEM_KV_TRANSFER_NCCL_FRAMING_H_
#define TANDEM_KV_TRANSFER_NCCL_FRAMING_H_

#include <array>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kv_transfer/wire.h"

namespace tandem {

using NcclHeaderBytes = std::array<char, kKvFrameHeaderBytes>;

// The header of one layer without its seq: validates the chunk and payload and takes the payload
// CRC (once, when the transfer is queued); EncodeNcclLayerHeader stamps the seq when the layer
// is posted.
absl::StatusOr<KvFrameHeader> MakeNcclLayerHeader(const KvChunkHeader& chunk,
                                                  std::span<const char> payload, bool checksum,
                                                  uint64_t max_payload_bytes);
NcclHeaderBytes EncodeNcclLayerHeader(KvFrameHeader h, uint64_t seq);

// Both steps at once: the header message of one layer. INVALID_ARGUMENT (naming the field) for a
// malformed chunk header, or a payload whose size is not KvChunkPayloadBytes(chunk);
// RESOURCE_EXHAUSTED over max_payload_bytes. With `checksum`, the payload CRC32C is computed (host
// memory only).
absl::StatusOr<NcclHeaderBytes> EncodeNcclLayerHeader(uint64_t seq, const KvChunkHeader& chunk,
                                                      std::span<const char> payload, bool checksum,
                                                      uint64_t max_payload_bytes);

// Decodes a received header message: DATA_LOSS for a bad magic or header CRC, INVALID_ARGUMENT
// for an ACK frame, a malformed field, or a seq other than `expected_seq`.
absl::StatusOr<KvFrameHeader> DecodeNcclLayerHeader(std::span<const char> bytes,
                                                    uint64_t expected_seq,
                                                    uint64_t max_payload_bytes);

// Checks a received payload against its header: size, and the CRC when `checksum`
// (DATA_LOSS on mismatch).
absl::Status VerifyNcclPayload(const KvFrameHeader& h, std::span<const char> payload,
                               bool checksum);

}  // namespace tandem

#endif  // TANDEM_KV_TRANSFER_NCCL_FRAMING_H_
