// Tests of runtime/data: the .bin writer's bytes against llm.c's format, reading sequences back
// (sub-ranges, wrap-around, labels the next tokens), header validation and its errors, and the
// synthetic source (deterministic per seed, a single cycle through the vocabulary, learnable:
// one bigram table predicts every sequence).
#include "runtime/data.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include "core/error.h"
#include "tests/core/expect_error.h"
#include "tests/runtime/temp_dir.h"

namespace parasol::runtime {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}
// A little-endian int32 / uint16 at a byte offset.
int32_t i32_at(const std::string& b, size_t at) {
  uint32_t u = 0;
  for (int k = 3; k >= 0; --k) u = u << 8 | static_cast<unsigned char>(b[at + k]);
  return static_cast<int32_t>(u);
}
void put_i32(std::string& b, size_t at, int32_t v) {
  for (int k = 0; k < 4; ++k) b[at + k] = static_cast<char>(static_cast<uint32_t>(v) >> (8 * k));
}

std::vector<int32_t> some_tokens(int n) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7919 + 13) % 50257;  // GPT-2's vocabulary
  t[3] = 65535;                                                // the largest uint16
  return t;
}

TEST(TokenFile, WriterProducesLlmcsFormat) {
  TempDir tmp;
  const std::vector<int32_t> tokens = some_tokens(1000);
  write_token_file(tmp.sub("a.bin"), tokens);
  const std::string b = read_bytes(tmp.sub("a.bin"));
  ASSERT_EQ(b.size(), 256u * 4u + 2u * tokens.size());
  EXPECT_EQ(i32_at(b, 0), 20240520);
  EXPECT_EQ(i32_at(b, 4), 1);
  EXPECT_EQ(i32_at(b, 8), 1000);
  for (size_t k = 3; k < 256; ++k) EXPECT_EQ(i32_at(b, 4 * k), 0) << k;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int got = static_cast<unsigned char>(b[1024 + 2 * i]) |
                    static_cast<unsigned char>(b[1024 + 2 * i + 1]) << 8;
    ASSERT_EQ(got, tokens[i]) << i;
  }
  const TokenFileHeader h = read_token_file_header(tmp.sub("a.bin"));
  EXPECT_EQ(h.magic, 20240520);
  EXPECT_EQ(h.version, 1);
  EXPECT_EQ(h.tokens, 1000);
}

// Sequence s holds stream positions s * seq + [0, seq), wrapping round the file; labels are the
// tokens one position later; any sub-range reads the same tokens as the whole sequence.
TEST(TokenFile, SequencesWrapRoundTheFile) {
  TempDir tmp;
  const std::vector<int32_t> tokens = some_tokens(1000);
  write_token_file(tmp.sub("a.bin"), tokens);
  const int64_t seq = 64;
  TokenFile f(tmp.sub("a.bin"), seq);
  EXPECT_EQ(f.tokens(), 1000);
  for (int64_t s : {0, 1, 14, 15, 16, 31, 1000003}) {  // 15: positions 960..1023 wrap
    std::vector<int32_t> t(seq), l(seq);
    f.fill(s, 0, seq, t.data(), l.data());
    for (int64_t i = 0; i < seq; ++i) {
      const int64_t pos = s * seq + i;
      ASSERT_EQ(t[i], tokens[pos % 1000]) << s << " " << i;
      ASSERT_EQ(l[i], tokens[(pos + 1) % 1000]) << s << " " << i;
    }
    for (auto [start, len] : {std::pair{0, 1}, {5, 20}, {32, 32}, {63, 1}}) {
      std::vector<int32_t> ts(len), ls(len);
      f.fill(s, start, len, ts.data(), ls.data());
      for (int i = 0; i < len; ++i) {
        ASSERT_EQ(ts[i], t[start + i]);
        ASSERT_EQ(ls[i], l[start + i]);
      }
    }
  }
  // A file shorter than a sequence wraps more than once.
  write_token_file(tmp.sub("short.bin"), {5, 6, 7});
  TokenFile s(tmp.sub("short.bin"), 8);
  std::vector<int32_t> t(8), l(8);
  s.fill(1, 0, 8, t.data(), l.data());  // positions 8..15 = 2, 0, 1, 2, ...
  EXPECT_EQ(t, (std::vector<int32_t>{7, 5, 6, 7, 5, 6, 7, 5}));
  EXPECT_EQ(l, (std::vector<int32_t>{5, 6, 7, 5, 6, 7, 5, 6}));
}

TEST(TokenFile, ValidatesTheHeaderAndTheTokens) {
  TempDir tmp;
  const std::string good = tmp.sub("good.bin");
  write_token_file(good, some_tokens(100));
  const std::string bytes = read_bytes(good);

  ExpectError([&] { TokenFile(tmp.sub("none.bin"), 8); }, tmp.sub("none.bin"), "missing");
  write_bytes(tmp.sub("tiny.bin"), bytes.substr(0, 100));
  ExpectError([&] { TokenFile(tmp.sub("tiny.bin"), 8); }, tmp.sub("tiny.bin"),
              "fewer than the 1024-byte header");

  std::string b = bytes;
  put_i32(b, 0, 20240521);
  write_bytes(tmp.sub("magic.bin"), b);
  ExpectError([&] { TokenFile(tmp.sub("magic.bin"), 8); }, tmp.sub("magic.bin") + ".header.magic",
              "20240521 is not 20240520");

  b = bytes;
  put_i32(b, 4, 2);
  write_bytes(tmp.sub("version.bin"), b);
  ExpectError([&] { read_token_file_header(tmp.sub("version.bin")); },
              tmp.sub("version.bin") + ".header.version", "2 is not supported");

  b = bytes;
  put_i32(b, 8, 1);
  write_bytes(tmp.sub("one.bin"), b.substr(0, 1026));
  ExpectError([&] { TokenFile(tmp.sub("one.bin"), 8); }, tmp.sub("one.bin") + ".header.tokens",
              "at least 2 tokens");

  write_bytes(tmp.sub("cut.bin"), bytes.substr(0, bytes.size() - 2));
  ExpectError([&] { TokenFile(tmp.sub("cut.bin"), 8); }, tmp.sub("cut.bin"), "(truncated)");

  // A token beyond the model's vocabulary, found when read.
  TokenFile f(good, 8, 50000);
  std::vector<int32_t> t(8), l(8);
  ExpectError([&] { f.fill(0, 0, 8, t.data(), l.data()); }, good,
              "token 65535 at position 3 is not below the model's vocabulary size 50000");
  EXPECT_NO_THROW(TokenFile(good, 8, 65536).fill(0, 0, 8, t.data(), l.data()));

  ExpectError([&] { f.fill(0, 4, 5, t.data(), l.data()); }, "data.fill", "[4, 9)");
  ExpectError([&] { f.fill(-1, 0, 1, t.data(), l.data()); }, "data.fill", "sequence -1");
  ExpectError(
      [&] {
        write_token_file(tmp.sub("w.bin"), {1, 2, 70000});
      },
      "tokens[2]", "70000 does not fit");
  ExpectError([&] { write_token_file(tmp.sub("w.bin"), {1, -1}); }, "tokens[1]", "-1");
  ExpectError(
      [&] {
        write_token_file(tmp.sub("no/such/dir.bin"), {1, 2});
      },
      tmp.sub("no/such/dir.bin"), "cannot create");
}

TEST(SyntheticTokens, DeterministicPerSeed) {
  SyntheticTokens a(512, 64, 7), b(512, 64, 7), c(512, 64, 8);
  std::vector<int32_t> ta(64), la(64), tb(64), lb(64), tc(64), lc(64);
  int differ = 0;
  for (int64_t s : {0, 1, 99, 123456}) {
    a.fill(s, 0, 64, ta.data(), la.data());
    b.fill(s, 0, 64, tb.data(), lb.data());
    c.fill(s, 0, 64, tc.data(), lc.data());
    EXPECT_EQ(ta, tb);
    EXPECT_EQ(la, lb);
    differ += ta != tc;
  }
  EXPECT_EQ(differ, 4);
}

// Tokens are in the vocabulary, labels are the next tokens, the successor function is one cycle
// through the whole vocabulary, sequences start in different places, and sub-ranges agree.
TEST(SyntheticTokens, AWalkAlongOneCycleOfTheVocabulary) {
  const int64_t V = 300, seq = 32;
  SyntheticTokens src(V, seq, 42);
  EXPECT_EQ(src.vocab(), V);
  std::set<int32_t> seen;
  int32_t tok = 0;
  for (int64_t i = 0; i < V; ++i) {
    seen.insert(tok);
    tok = src.next(tok);
    ASSERT_GE(tok, 0);
    ASSERT_LT(tok, V);
  }
  EXPECT_EQ(tok, 0);  // back to the start after exactly V steps
  EXPECT_EQ(static_cast<int64_t>(seen.size()), V);

  std::set<int32_t> starts;
  std::vector<int32_t> t(seq), l(seq);
  for (int64_t s = 0; s < 50; ++s) {
    src.fill(s, 0, seq, t.data(), l.data());
    starts.insert(t[0]);
    for (int64_t i = 0; i < seq; ++i) {
      ASSERT_TRUE(t[i] >= 0 && t[i] < V);
      ASSERT_EQ(l[i], src.next(t[i]));
      if (i + 1 < seq) {
        ASSERT_EQ(l[i], t[i + 1]);
      }
    }
    std::vector<int32_t> ts(10), ls(10);
    src.fill(s, 17, 10, ts.data(), ls.data());
    for (int i = 0; i < 10; ++i) {
      ASSERT_EQ(ts[i], t[17 + i]);
      ASSERT_EQ(ls[i], l[17 + i]);
    }
  }
  EXPECT_GT(starts.size(), 40u);
  // Not the identity order: a model must learn the successor table.
  int fixed = 0;
  for (int32_t x = 0; x < V; ++x) fixed += src.next(x) == (x + 1) % V;
  EXPECT_LT(fixed, 10);
}

// A bigram table counted on some sequences predicts every label of other sequences whose
// tokens it has seen: the data has no entropy left for a model to fail on.
TEST(SyntheticTokens, ABigramTableLearnsIt) {
  const int64_t V = 512, seq = 64;
  SyntheticTokens src(V, seq, 3);
  std::map<int32_t, std::map<int32_t, int>> counts;
  std::vector<int32_t> t(seq), l(seq);
  for (int64_t s = 0; s < 200; ++s) {
    src.fill(s, 0, seq, t.data(), l.data());
    for (int64_t i = 0; i < seq; ++i) ++counts[t[i]][l[i]];
  }
  int64_t right = 0, seen = 0;
  for (int64_t s = 1000; s < 1100; ++s) {
    src.fill(s, 0, seq, t.data(), l.data());
    for (int64_t i = 0; i < seq; ++i) {
      auto it = counts.find(t[i]);
      if (it == counts.end()) continue;
      ++seen;
      EXPECT_EQ(it->second.size(), 1u);  // one successor per token
      right += it->second.begin()->first == l[i];
    }
  }
  EXPECT_GT(seen, 3000);
  EXPECT_EQ(right, seen);
}

TEST(TokenSource, OpensAFileOrSyntheticTokens) {
  TempDir tmp;
  write_token_file(tmp.sub("a.bin"), some_tokens(100));
  auto f = open_token_source(tmp.sub("a.bin"), 65536, 16, 1);
  auto s = open_token_source("", 512, 16, 1);
  EXPECT_NE(dynamic_cast<TokenFile*>(f.get()), nullptr);
  EXPECT_NE(dynamic_cast<SyntheticTokens*>(s.get()), nullptr);
  EXPECT_EQ(f->seq_len(), 16);
  ExpectError([] { SyntheticTokens(1, 16, 0); }, "data.vocab", "must be in [2, 2^31)");
  ExpectError([] { SyntheticTokens(16, 0, 0); }, "data.seq_len", "must be >= 1");
}

}  // namespace
}  // namespace parasol::runtime
