#include "kv_transfer/wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "lib/crc32c/crc32c.h"

namespace tandem {
namespace {

KvChunkHeader SampleChunk() {
  KvChunkHeader c;
  c.request_id = 0x1122334455667788ull;
  c.lease_id = 0x0102030405060708ull;
  c.generation = 77;
  c.capability = "0123456789abcdef";
  c.layer = 5;
  c.token_start = 32;
  c.token_count = 3;
  c.dtype = DType::kF32;
  c.width = 4;
  return c;
}

std::string SamplePayload(const KvChunkHeader& c) {
  std::string p(2 * c.token_count * c.width * DTypeSize(c.dtype), '\0');
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<char>(i * 7 + 1);
  return p;
}

template <typename T>
void PutLe(std::string& frame, size_t offset, T v) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    frame[offset + i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
  }
}

// Rewrites the header CRC so a mutated field reaches field validation.
void FixHeaderCrc(std::string& frame) {
  PutLe<uint32_t>(frame, 84, Crc32cExtend(0, frame.data(), 84));
}

TEST(WireTest, DataFrameRoundTrip) {
  const KvChunkHeader c = SampleChunk();
  const std::string payload = SamplePayload(c);
  const std::string frame = EncodeKvDataFrame(99, c, payload);
  ASSERT_EQ(frame.size(), kKvFrameHeaderBytes + payload.size());
  EXPECT_EQ(frame.substr(0, 4), "TKV1");

  absl::StatusOr<KvFrame> f = DecodeKvFrame(frame);
  ASSERT_TRUE(f.ok()) << f.status();
  const KvFrameHeader& h = f->header;
  EXPECT_EQ(h.kind, KvFrameKind::kData);
  EXPECT_EQ(h.seq, 99u);
  EXPECT_EQ(h.chunk.request_id, c.request_id);
  EXPECT_EQ(h.chunk.lease_id, c.lease_id);
  EXPECT_EQ(h.chunk.generation, c.generation);
  EXPECT_EQ(h.chunk.layer, c.layer);
  EXPECT_EQ(h.chunk.token_start, c.token_start);
  EXPECT_EQ(h.chunk.token_count, c.token_count);
  EXPECT_EQ(h.chunk.dtype, c.dtype);
  EXPECT_EQ(h.chunk.width, c.width);
  EXPECT_EQ(h.chunk.capability, c.capability);
  EXPECT_EQ(h.payload_length, payload.size());
  EXPECT_EQ(h.payload_crc, Crc32c(payload));
  EXPECT_EQ(std::string(f->payload.data(), f->payload.size()), payload);
}

TEST(WireTest, HalfPrecisionDtypesSizeTheirPayload) {
  KvChunkHeader c = SampleChunk();
  c.dtype = DType::kBF16;
  const std::string payload(2 * c.token_count * c.width * 2, 'x');
  absl::StatusOr<KvFrame> f = DecodeKvFrame(EncodeKvDataFrame(1, c, payload));
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.chunk.dtype, DType::kBF16);
}

TEST(WireTest, AckFrameRoundTrip) {
  const KvChunkHeader c = SampleChunk();
  const absl::Status refused = absl::AbortedError("lease 5: stale generation 3 (live: 4)");
  const std::string frame = EncodeKvAckFrame(12, c, refused);
  absl::StatusOr<KvFrame> f = DecodeKvFrame(frame);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->header.kind, KvFrameKind::kAck);
  EXPECT_EQ(f->header.seq, 12u);
  EXPECT_EQ(f->header.chunk.lease_id, c.lease_id);
  EXPECT_EQ(f->header.chunk.generation, c.generation);
  EXPECT_EQ(f->header.chunk.layer, c.layer);
  EXPECT_EQ(f->header.chunk.token_start, c.token_start);
  EXPECT_TRUE(f->header.chunk.capability.empty()) << "an ACK never echoes the capability";
  EXPECT_EQ(frame.substr(64, kKvCapabilityBytes), std::string(kKvCapabilityBytes, '\0'));
  EXPECT_EQ(KvAckStatus(f->header, f->payload), refused);

  absl::StatusOr<KvFrame> ok = DecodeKvFrame(EncodeKvAckFrame(13, c, absl::OkStatus()));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_TRUE(KvAckStatus(ok->header, ok->payload).ok());
}

TEST(WireTest, LongAckMessageIsTruncated) {
  const std::string frame =
      EncodeKvAckFrame(1, SampleChunk(), absl::InternalError(std::string(5000, 'm')));
  absl::StatusOr<KvFrame> f = DecodeKvFrame(frame);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->payload.size(), kMaxAckMessageBytes);
}

struct Mutation {
  std::string name;
  std::function<void(std::string&)> apply;
  absl::StatusCode want;
  bool ack = false;  // mutate an ACK frame instead of a DATA frame
};

TEST(WireTest, RejectsEveryMalformedField) {
  using Code = absl::StatusCode;
  const std::vector<Mutation> mutations = {
      {"magic", [](std::string& f) { f[0] = 'X'; }, Code::kDataLoss},
      {"header crc", [](std::string& f) { f[84] ^= 1; }, Code::kDataLoss},
      {"capability", [](std::string& f) { f[70] ^= 1; }, Code::kDataLoss},
      {"unfixed field", [](std::string& f) { f[40] ^= 1; }, Code::kDataLoss},
      {"version", [](std::string& f) { PutLe<uint16_t>(f, 4, 1); }, Code::kInvalidArgument},
      {"kind 0", [](std::string& f) { PutLe<uint8_t>(f, 6, 0); }, Code::kInvalidArgument},
      {"kind 3", [](std::string& f) { PutLe<uint8_t>(f, 6, 3); }, Code::kInvalidArgument},
      {"dtype", [](std::string& f) { PutLe<uint8_t>(f, 7, 9); }, Code::kInvalidArgument},
      {"status in data", [](std::string& f) { PutLe<uint32_t>(f, 52, 2); }, Code::kInvalidArgument},
      {"token_count 0", [](std::string& f) { PutLe<uint32_t>(f, 44, 0); }, Code::kInvalidArgument},
      {"width 0", [](std::string& f) { PutLe<uint32_t>(f, 48, 0); }, Code::kInvalidArgument},
      {"token range overflow", [](std::string& f) { PutLe<uint32_t>(f, 40, 0xFFFFFFFEu); },
       Code::kInvalidArgument},
      {"payload_length", [](std::string& f) { PutLe<uint64_t>(f, 56, 95); },
       Code::kInvalidArgument},
      {"payload_length huge", [](std::string& f) { PutLe<uint64_t>(f, 56, ~uint64_t{0}); },
       Code::kInvalidArgument},
      {"width over limit", [](std::string& f) { PutLe<uint32_t>(f, 48, 0x40000000u); },
       Code::kResourceExhausted},
      {"ack dtype", [](std::string& f) { PutLe<uint8_t>(f, 7, 1); }, Code::kInvalidArgument, true},
      {"ack width", [](std::string& f) { PutLe<uint32_t>(f, 48, 4); }, Code::kInvalidArgument,
       true},
      {"ack status", [](std::string& f) { PutLe<uint32_t>(f, 52, 17); }, Code::kInvalidArgument,
       true},
      {"ack capability", [](std::string& f) { f[70] = 'a'; }, Code::kInvalidArgument, true},
      {"ack message length", [](std::string& f) { PutLe<uint64_t>(f, 56, 1025); },
       Code::kInvalidArgument, true},
  };
  const KvChunkHeader c = SampleChunk();
  for (const Mutation& m : mutations) {
    std::string frame = m.ack ? EncodeKvAckFrame(1, c, absl::InternalError("x"))
                              : EncodeKvDataFrame(1, c, SamplePayload(c));
    m.apply(frame);
    if (m.want != absl::StatusCode::kDataLoss) FixHeaderCrc(frame);
    absl::StatusOr<KvFrameHeader> h = DecodeKvFrameHeader(frame);
    EXPECT_EQ(h.status().code(), m.want) << m.name << ": " << h.status();
  }
}

TEST(WireTest, PayloadCorruptionIsDataLoss) {
  const KvChunkHeader c = SampleChunk();
  std::string frame = EncodeKvDataFrame(1, c, SamplePayload(c));
  frame[kKvFrameHeaderBytes + 5] ^= 0x10;
  EXPECT_TRUE(DecodeKvFrameHeader(frame).ok());
  EXPECT_EQ(DecodeKvFrame(frame).status().code(), absl::StatusCode::kDataLoss);
}

TEST(WireTest, FrameLimitIsResourceExhausted) {
  const KvChunkHeader c = SampleChunk();  // 96-byte payload
  const std::string frame = EncodeKvDataFrame(1, c, SamplePayload(c));
  EXPECT_TRUE(DecodeKvFrame(frame, 96).ok());
  EXPECT_EQ(DecodeKvFrame(frame, 95).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(WireTest, RawHeaderIsReportedForAnswerableErrors) {
  KvChunkHeader c = SampleChunk();
  std::string frame = EncodeKvDataFrame(31, c, SamplePayload(c));
  PutLe<uint32_t>(frame, 48, 0x40000000u);
  FixHeaderCrc(frame);
  KvFrameHeader raw;
  EXPECT_FALSE(DecodeKvFrameHeader(frame, kDefaultMaxFrameBytes, &raw).ok());
  EXPECT_EQ(raw.seq, 31u);
  EXPECT_EQ(raw.chunk.lease_id, c.lease_id);
}

TEST(WireTest, EveryTruncationIsRejected) {
  const KvChunkHeader c = SampleChunk();
  const std::string data = EncodeKvDataFrame(1, c, SamplePayload(c));
  const std::string ack = EncodeKvAckFrame(1, c, absl::InternalError("nope"));
  for (const std::string* frame : {&data, &ack}) {
    for (size_t n = 0; n < frame->size(); ++n) {
      EXPECT_FALSE(DecodeKvFrame(std::span<const char>(frame->data(), n)).ok()) << n;
    }
    EXPECT_TRUE(DecodeKvFrame(*frame).ok());
    EXPECT_FALSE(DecodeKvFrame(*frame + "x").ok());
  }
}

TEST(WireTest, PayloadBytes) {
  KvChunkHeader c = SampleChunk();
  EXPECT_EQ(*KvChunkPayloadBytes(c, kDefaultMaxFrameBytes), 96u);
  c.dtype = DType::kF16;
  EXPECT_EQ(*KvChunkPayloadBytes(c, kDefaultMaxFrameBytes), 48u);
  c.dtype = static_cast<DType>(3);
  EXPECT_EQ(KvChunkPayloadBytes(c, kDefaultMaxFrameBytes).status().code(),
            absl::StatusCode::kInvalidArgument);
  c = SampleChunk();
  c.token_count = 0xFFFFFFF0u;
  c.token_start = 0;
  c.width = 0xFFFFFFFFu;  // 2^67 bytes: must not wrap around to a small number
  EXPECT_EQ(KvChunkPayloadBytes(c, ~uint64_t{0}).status().code(),
            absl::StatusCode::kResourceExhausted);
}

// Random garbage, random bit flips of valid frames, and random headers with a valid CRC (so
// field validation sees them): never a crash, and whatever decodes is self-consistent.
TEST(WireTest, GarbageNeverCrashes) {
  std::mt19937_64 rng(7);
  const KvChunkHeader c = SampleChunk();
  const std::string valid = EncodeKvDataFrame(1, c, SamplePayload(c));
  int decoded = 0;
  for (int i = 0; i < 30000; ++i) {
    std::string buf;
    switch (i % 3) {
      case 0:
        buf.resize(rng() % 200);
        for (char& ch : buf) ch = static_cast<char>(rng());
        break;
      case 1:
        buf = valid;
        for (int k = 0, n = 1 + rng() % 4; k < n; ++k) buf[rng() % buf.size()] ^= 1 << (rng() % 8);
        if (rng() % 2) FixHeaderCrc(buf);
        break;
      case 2:
        buf = valid;
        for (size_t k = 4; k < 84; ++k) {
          if (rng() % 4 == 0) buf[k] = static_cast<char>(rng());
        }
        FixHeaderCrc(buf);
        buf.resize(rng() % (buf.size() + 1));
        break;
    }
    absl::StatusOr<KvFrame> f = DecodeKvFrame(buf, 1 << 20);
    if (f.ok()) {
      ++decoded;
      EXPECT_EQ(f->payload.size(), f->header.payload_length);
      EXPECT_EQ(kKvFrameHeaderBytes + f->payload.size(), buf.size());
    }
  }
  EXPECT_LT(decoded, 30000);
}

}  // namespace
}  // namespace tandem
