#include "lib/crc32c/crc32c.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace tandem {
namespace {

struct Vector {
  std::string data;
  uint32_t crc;
};

// "123456789" is the customary check value; the 32-byte patterns are RFC 3720, appendix B.4.
std::vector<Vector> KnownVectors() {
  std::string ascending(32, '\0');
  std::string descending(32, '\0');
  for (int i = 0; i < 32; ++i) {
    ascending[i] = static_cast<char>(i);
    descending[i] = static_cast<char>(31 - i);
  }
  return {
      {"", 0x00000000u},
      {"123456789", 0xE3069283u},
      {std::string(32, '\0'), 0x8A9136AAu},
      {std::string(32, '\xff'), 0x62A8AB43u},
      {ascending, 0x46DD794Eu},
      {descending, 0x113FDB5Cu},
  };
}

TEST(Crc32cTest, SoftwareMatchesKnownVectors) {
  for (const Vector& v : KnownVectors()) {
    EXPECT_EQ(Crc32cSoftwareExtend(0, v.data.data(), v.data.size()), v.crc) << v.data.size();
  }
}

TEST(Crc32cTest, HardwareMatchesKnownVectors) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  for (const Vector& v : KnownVectors()) {
    EXPECT_EQ(Crc32cHardwareExtend(0, v.data.data(), v.data.size()), v.crc) << v.data.size();
  }
}

TEST(Crc32cTest, DispatchMatchesKnownVectors) {
  for (const Vector& v : KnownVectors()) EXPECT_EQ(Crc32c(v.data), v.crc);
}

TEST(Crc32cTest, ExtendEqualsWholeBuffer) {
  const std::string s = "The quick brown fox jumps over the lazy dog, twice over.";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    const uint32_t head = Crc32cExtend(0, s.data(), cut);
    EXPECT_EQ(Crc32cExtend(head, s.data() + cut, s.size() - cut), Crc32c(s)) << cut;
  }
}

TEST(Crc32cTest, HardwareAndSoftwareAgreeOnRandomBuffers) {
  if (!Crc32cHardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(42);
  std::string buf(70000, '\0');
  for (char& c : buf) c = static_cast<char>(rng());
  // Every length 0..70 at every misalignment 0..7, then larger random slices.
  for (size_t offset = 0; offset < 8; ++offset) {
    for (size_t n = 0; n <= 70; ++n) {
      ASSERT_EQ(Crc32cHardwareExtend(0, buf.data() + offset, n),
                Crc32cSoftwareExtend(0, buf.data() + offset, n))
          << offset << " " << n;
    }
  }
  for (int i = 0; i < 200; ++i) {
    const size_t offset = rng() % 1000;
    const size_t n = rng() % (buf.size() - offset);
    const uint32_t seed = rng();
    ASSERT_EQ(Crc32cHardwareExtend(seed, buf.data() + offset, n),
              Crc32cSoftwareExtend(seed, buf.data() + offset, n));
  }
}

}  // namespace
}  // namespace tandem
