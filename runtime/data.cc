// Token sources: llm.c .bin files (validated header, pread streaming with wrap-around) and
// seeded synthetic bigram walks.
#include "runtime/data.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

namespace {

constexpr int64_t kHeaderBytes = kTokenFileHeaderInts * 4;

int32_t le32(const unsigned char* p) {
  return static_cast<int32_t>(static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
                              static_cast<uint32_t>(p[2]) << 16 |
                              static_cast<uint32_t>(p[3]) << 24);
}

void pread_all(int fd, void* data, int64_t bytes, int64_t offset, const std::string& path) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pread(fd, p, static_cast<size_t>(bytes), offset);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(path, std::string("read failed: ") + strerror(errno));
    if (n == 0) throw Error(path, "truncated: ends at byte " + std::to_string(offset));
    p += n;
    bytes -= n;
    offset += n;
  }
}

// Validates the header of the open file `fd`.
TokenFileHeader read_header(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) throw Error(path, std::string("cannot stat: ") + strerror(errno));
  const int64_t size = st.st_size;
  if (size < kHeaderBytes)
    throw Error(path, "has " + std::to_string(size) + " bytes, fewer than the " +
                          std::to_string(kHeaderBytes) + "-byte header of a token file");
  unsigned char raw[12];
  pread_all(fd, raw, sizeof raw, 0, path);
  TokenFileHeader h;
  h.magic = le32(raw);
  h.version = le32(raw + 4);
  h.tokens = le32(raw + 8);
  if (h.magic != kTokenFileMagic)
    throw Error(path + ".header.magic", std::to_string(h.magic) + " is not " +
                                            std::to_string(kTokenFileMagic) +
                                            " (not an llm.c token file)");
  if (h.version != kTokenFileVersion)
    throw Error(path + ".header.version",
                std::to_string(h.version) + " is not supported (version 1: uint16 tokens)");
  if (h.tokens < 2)
    throw Error(path + ".header.tokens",
                std::to_string(h.tokens) + ": a token file needs at least 2 tokens");
  const int64_t want = kHeaderBytes + 2 * h.tokens;
  if (size != want)
    throw Error(path, "has " + std::to_string(size) + " bytes; its header's " +
                          std::to_string(h.tokens) + " tokens need " + std::to_string(want) +
                          (size < want ? " (truncated)" : ""));
  return h;
}

int open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0)
    throw Error(path, errno == ENOENT ? "missing" : std::string("cannot open: ") + strerror(errno));
  return fd;
}

}  // namespace

TokenSource::TokenSource(int64_t seq_len) : seq_(seq_len) {
  if (seq_len < 1) throw Error("data.seq_len", std::to_string(seq_len) + " must be >= 1");
}

void TokenSource::fill(int64_t sequence_index, int64_t start, int64_t len, int32_t* tokens,
                       int32_t* labels) const {
  if (sequence_index < 0 || start < 0 || len < 0 || start + len > seq_)
    throw Error("data.fill", "sequence " + std::to_string(sequence_index) + ", positions [" +
                                 std::to_string(start) + ", " + std::to_string(start + len) +
                                 ") are not within a sequence of " + std::to_string(seq_));
  if (len > 0) do_fill(sequence_index, start, len, tokens, labels);
}

TokenFileHeader read_token_file_header(const std::string& path) {
  const int fd = open_read(path);
  try {
    const TokenFileHeader h = read_header(fd, path);
    ::close(fd);
    return h;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

void write_token_file(const std::string& path, const std::vector<int32_t>& tokens) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < 0 || tokens[i] > 65535)
      throw Error("tokens[" + std::to_string(i) + "]",
                  std::to_string(tokens[i]) + " does not fit a uint16 token file");
  if (tokens.size() > 0x7FFFFFFFu)
    throw Error("tokens", "more than 2^31 - 1 tokens do not fit the header");
  std::vector<unsigned char> bytes(static_cast<size_t>(kHeaderBytes) + 2 * tokens.size(), 0);
  auto put32 = [&](size_t at, uint32_t v) {
    for (int k = 0; k < 4; ++k) bytes[at + k] = static_cast<unsigned char>(v >> (8 * k));
  };
  put32(0, static_cast<uint32_t>(kTokenFileMagic));
  put32(4, static_cast<uint32_t>(kTokenFileVersion));
  put32(8, static_cast<uint32_t>(tokens.size()));
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = static_cast<uint32_t>(tokens[i]);
    bytes[kHeaderBytes + 2 * i] = static_cast<unsigned char>(t);
    bytes[kHeaderBytes + 2 * i + 1] = static_cast<unsigned char>(t >> 8);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw Error(path, "cannot create");
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw SystemError(path, "write failed");
}

// ---- TokenFile --------------------------------------------------------------------------------

TokenFile::TokenFile(const std::string& path, int64_t seq_len, int64_t vocab)
    : TokenSource(seq_len), path_(path), vocab_(vocab) {
  fd_ = open_read(path);
  try {
    header_ = read_header(fd_, path);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

TokenFile::~TokenFile() {
  if (fd_ >= 0) ::close(fd_);
}

void TokenFile::do_fill(int64_t sequence_index, int64_t start, int64_t len, int32_t* tokens,
                        int32_t* labels) const {
  const int64_t n = header_.tokens;
  const int64_t first = (sequence_index % n * (seq_len() % n) + start) % n;
  // len + 1 consecutive stream positions from `first`, wrapping round the file.
  std::vector<uint16_t> raw(static_cast<size_t>(len + 1));
  int64_t done = 0, pos = first;
  while (done < len + 1) {
    const int64_t k = std::min(len + 1 - done, n - pos);
    std::vector<unsigned char> bytes(static_cast<size_t>(2 * k));
    pread_all(fd_, bytes.data(), 2 * k, kHeaderBytes + 2 * pos, path_);
    for (int64_t i = 0; i < k; ++i)
      raw[done + i] = static_cast<uint16_t>(bytes[2 * i] | bytes[2 * i + 1] << 8);
    done += k;
    pos = 0;
  }
  if (vocab_ > 0)
    for (int64_t i = 0; i <= len; ++i)
      if (raw[i] >= vocab_)
        throw Error(path_, "token " + std::to_string(raw[i]) + " at position " +
                               std::to_string((first + i) % n) +
                               " is not below the model's vocabulary size " +
                               std::to_string(vocab_));
  for (int64_t i = 0; i < len; ++i) {
    tokens[i] = raw[i];
    labels[i] = raw[i + 1];
  }
}

// ---- SyntheticTokens --------------------------------------------------------------------------

SyntheticTokens::SyntheticTokens(int64_t vocab, int64_t seq_len, uint64_t seed)
    : TokenSource(seq_len), seed_(seed) {
  if (vocab < 2 || vocab > (int64_t{1} << 31) - 1)
    throw Error("data.vocab", std::to_string(vocab) + " must be in [2, 2^31)");
  order_.resize(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) order_[i] = static_cast<int32_t>(i);
  // Fisher-Yates with counter-based draws.
  for (int64_t i = vocab - 1; i > 0; --i) {
    const uint64_t r = mix64(seed ^ mix64(static_cast<uint64_t>(i) + 0x5EED0000ull));
    std::swap(order_[i], order_[static_cast<int64_t>(r % static_cast<uint64_t>(i + 1))]);
  }
  position_.resize(order_.size());
  for (int64_t k = 0; k < vocab; ++k) position_[order_[k]] = static_cast<int32_t>(k);
}

int32_t SyntheticTokens::next(int32_t token) const {
  const int64_t v = vocab();
  return order_[(position_[token] + 1) % v];
}

void SyntheticTokens::do_fill(int64_t sequence_index, int64_t start, int64_t len, int32_t* tokens,
                              int32_t* labels) const {
  const uint64_t v = static_cast<uint64_t>(vocab());
  const uint64_t first =
      mix64(mix64(seed_ + 0xDA7A0000ull) ^ static_cast<uint64_t>(sequence_index)) % v;
  for (int64_t i = 0; i < len; ++i) {
    const uint64_t k = (first + static_cast<uint64_t>(start + i)) % v;
    tokens[i] = order_[k];
    labels[i] = order_[(k + 1) % v];
  }
}

std::unique_ptr<TokenSource> open_token_source(const std::string& path, int64_t vocab,
                                               int64_t seq_len, uint64_t seed) {
  if (path.empty()) return std::make_unique<SyntheticTokens>(vocab, seq_len, seed);
  return std::make_unique<TokenFile>(path, seq_len, vocab);
}

}  // namespace parasol::runtime
