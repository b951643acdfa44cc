// Token sources of the trainer: llm.c's .bin token files (and a writer for them), and seeded
// synthetic tokens that a model learns quickly. A source is addressed by sequence index, so a
// rank reads exactly the part of a sequence it works on, whatever the plan, and a resumed run
// continues at the saved sequence index.
//
// llm.c's .bin format (dev/data/data_common.py): a header of 256 little-endian int32 (header[0]
// = 20240520, header[1] = 1, header[2] = the number of tokens), then the tokens as
// little-endian uint16.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace parasol::runtime {

inline constexpr int32_t kTokenFileMagic = 20240520;
inline constexpr int32_t kTokenFileVersion = 1;
inline constexpr int64_t kTokenFileHeaderInts = 256;

class TokenSource {
 public:
  explicit TokenSource(int64_t seq_len);
  virtual ~TokenSource() = default;

  int64_t seq_len() const { return seq_; }
  // Tokens [start, start + len) of sequence `sequence_index` (length seq_len()) into tokens[0,
  // len) and the token that follows each into labels[0, len): labels[i] is the token at position
  // start + i + 1 of the same stream (the position after a sequence's last is the first of the
  // next sequence, as llm.c's loader does). Thread-safe.
  // REQUIRES (else parasol::Error "data.fill"): sequence_index >= 0, start >= 0, len >= 0,
  // start + len <= seq_len().
  void fill(int64_t sequence_index, int64_t start, int64_t len, int32_t* tokens,
            int32_t* labels) const;

 protected:
  // fill() after its argument checks.
  virtual void do_fill(int64_t sequence_index, int64_t start, int64_t len, int32_t* tokens,
                       int32_t* labels) const = 0;

 private:
  int64_t seq_;
};

struct TokenFileHeader {
  int32_t magic = 0;
  int32_t version = 0;
  int64_t tokens = 0;
};

// Reads and validates the header of a .bin token file. Throws parasol::Error naming the file
// and field: "<path>" (missing, shorter than the header, size not header + 2 x tokens),
// "<path>.header.magic", "<path>.header.version", "<path>.header.tokens" (fewer than 2).
TokenFileHeader read_token_file_header(const std::string& path);

// Writes `tokens` as a .bin token file. Throws parasol::Error ("tokens[i]") for a token outside
// [0, 65535], or naming the path when it cannot be written.
void write_token_file(const std::string& path, const std::vector<int32_t>& tokens);

// A .bin token file streamed from disk (pread): position p of the stream is token p mod N of the
// file (it wraps round), so sequence s holds file positions s * seq + [0, seq).
class TokenFile : public TokenSource {
 public:
  // Opens and validates `path` (read_token_file_header). vocab > 0: fill() throws
  // parasol::Error naming the file for a token >= vocab.
  TokenFile(const std::string& path, int64_t seq_len, int64_t vocab = 0);
  ~TokenFile() override;
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  int64_t tokens() const { return header_.tokens; }
  const std::string& path() const { return path_; }

 protected:
  void do_fill(int64_t sequence_index, int64_t start, int64_t len, int32_t* tokens,
               int32_t* labels) const override;

 private:
  std::string path_;
  int fd_ = -1;
  TokenFileHeader header_;
  int64_t vocab_ = 0;
};

// Seeded synthetic tokens: a random cyclic order of the vocabulary (drawn from the seed) is
// walked from a random start per sequence, so the next token is a fixed function of the current
// one (a bigram language with zero entropy): a model's loss falls quickly from log(vocab)
// towards 0. Position i of sequence s is order[(start(s) + i) mod vocab]; labels follow within
// the sequence (the label of a sequence's last position continues its walk).
class SyntheticTokens : public TokenSource {
 public:
  // REQUIRES (else parasol::Error "data.vocab" / "data.seq_len"): vocab >= 2, seq_len >= 1.
  SyntheticTokens(int64_t vocab, int64_t seq_len, uint64_t seed);

  int64_t vocab() const { return static_cast<int64_t>(order_.size()); }
  // The token that follows `token` in every sequence.
  int32_t next(int32_t token) const;

 protected:
  void do_fill(int64_t sequence_index, int64_t start, int64_t len, int32_t* tokens,
               int32_t* labels) const override;

 private:
  uint64_t seed_;
  std::vector<int32_t> order_;     // the cyclic order
  std::vector<int32_t> position_;  // position_[order_[k]] = k
};

// The trainer's source: the token file at `path`, or SyntheticTokens(vocab, seq_len, seed) when
// path is empty.
std::unique_ptr<TokenSource> open_token_source(const std::string& path, int64_t vocab,
                                               int64_t seq_len, uint64_t seed);

}  // namespace parasol::runtime
