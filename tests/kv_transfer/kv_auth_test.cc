// The seals of a KV session (kv_transfer/kv_auth.h): both ends of one handshake agree on them;
// a record checks only once, in order, in its direction, under its connection's keys.
#include "kv_transfer/kv_auth.h"

#include <gtest/gtest.h>

#include <string>

#include "kv_transfer/wire.h"

namespace tandem {
namespace {

struct Pair {
  KvSession receiver, sender;
};

Pair Connected(const ClusterSecret& secret, const std::string& rn, const std::string& sn) {
  return {KvSession(secret, rn, sn, /*receiver=*/true), KvSession(secret, rn, sn, false)};
}

TEST(KvSessionTest, RecordsCheckOnceInOrderAndOneWay) {
  const ClusterSecret secret = ClusterSecret::Generate();
  const std::string rn = RandomBytes(32), sn = RandomBytes(32);
  Pair p = Connected(secret, rn, sn);
  ASSERT_TRUE(p.sender.sealed());
  EXPECT_EQ(p.sender.tag_bytes(), kKvFrameTagBytes);
  const std::string t1 = p.sender.Tag("header one");
  const std::string t2 = p.sender.Tag("payload one");
  EXPECT_EQ(t1.size(), kKvFrameTagBytes);
  // Reordered: the counter differs.
  EXPECT_FALSE(p.receiver.Open("payload one", t2));
  Pair q = Connected(secret, rn, sn);
  q.sender.Tag("header one");
  const std::string u2 = q.sender.Tag("payload one");
  EXPECT_TRUE(q.receiver.Open("header one", t1));
  EXPECT_TRUE(q.receiver.Open("payload one", u2));
  // Replayed: the next record is expected.
  EXPECT_FALSE(q.receiver.Open("payload one", u2));
  // Altered.
  Pair r = Connected(secret, rn, sn);
  const std::string v = r.sender.Tag("bytes");
  EXPECT_FALSE(r.receiver.Open("bytez", v));
  // In pieces, as a payload read through a buffer.
  Pair w = Connected(secret, rn, sn);
  const std::string whole = w.sender.Tag("abcdef");
  w.receiver.BeginReceive();
  w.receiver.ReceivePart("abc");
  w.receiver.ReceivePart("def");
  EXPECT_TRUE(w.receiver.ReceivedTagValid(whole));
  // The other direction has its own key: an ACK's tag does not seal data and vice versa.
  Pair x = Connected(secret, rn, sn);
  const std::string from_receiver = x.receiver.Tag("ack");
  EXPECT_FALSE(x.receiver.Open("ack", from_receiver));
  EXPECT_TRUE(x.sender.Open("ack", from_receiver));
}

TEST(KvSessionTest, KeysBelongToOneConnectionAndOneSecret) {
  const ClusterSecret secret = ClusterSecret::Generate();
  const std::string rn = RandomBytes(32), sn = RandomBytes(32);
  Pair a = Connected(secret, rn, sn);
  const std::string tag = a.sender.Tag("frame");
  Pair other_connection = Connected(secret, RandomBytes(32), sn);
  EXPECT_FALSE(other_connection.receiver.Open("frame", tag));
  Pair other_cluster = Connected(ClusterSecret::Generate(), rn, sn);
  EXPECT_FALSE(other_cluster.receiver.Open("frame", tag));
  // Unsealed sessions (TLS protects the frames) add and check nothing.
  KvSession plain;
  EXPECT_FALSE(plain.sealed());
  EXPECT_EQ(plain.Tag("frame"), "");
  EXPECT_TRUE(plain.Open("frame", ""));
}

TEST(KvSessionTest, SealKvFrameTagsHeaderAndPayloadApart) {
  const ClusterSecret secret = ClusterSecret::Generate();
  const std::string rn = RandomBytes(32), sn = RandomBytes(32);
  Pair p = Connected(secret, rn, sn);
  KvChunkHeader h;
  h.lease_id = 5;
  h.token_count = 1;
  h.width = 4;
  const std::string frame = EncodeKvDataFrame(9, h, std::string(32, '\1'));
  const std::string sealed = SealKvFrame(p.sender, frame);
  ASSERT_EQ(sealed.size(), frame.size() + 2 * kKvFrameTagBytes);
  const std::string head = sealed.substr(0, kKvFrameHeaderBytes);
  EXPECT_EQ(head, frame.substr(0, kKvFrameHeaderBytes));
  EXPECT_TRUE(p.receiver.Open(head, sealed.substr(kKvFrameHeaderBytes, kKvFrameTagBytes)));
  const size_t payload_at = kKvFrameHeaderBytes + kKvFrameTagBytes;
  EXPECT_TRUE(p.receiver.Open(sealed.substr(payload_at, 32), sealed.substr(payload_at + 32)));
  KvSession plain;
  EXPECT_EQ(SealKvFrame(plain, frame), frame);
}

}  // namespace
}  // namespace tandem
