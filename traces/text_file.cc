// TextFileBuf: plain bytes, or gzip inflated through zlib a buffer at a time.
#include "traces/text_file.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace parasol::traces {

namespace {
constexpr size_t kBuffer = size_t{1} << 20;  // bytes read or inflated at a time
}  // namespace

struct TextFileBuf::Inflater {
  z_stream z{};
  size_t consumed = 0;      // compressed bytes handed to zlib before the current input buffer
  bool at_eof = false;      // the file has no more compressed bytes
  bool ended = false;       // the last member ended and nothing follows
  bool mid_member = false;  // inflate has started a member that has not ended
};

TextFileBuf::TextFileBuf(const std::string& path) : path_(path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
    throw Error(path, "cannot open file: is a directory");
  file_ = std::fopen(path.c_str(), "rb");
  if (!file_) throw Error(path, std::string("cannot open file: ") + std::strerror(errno));
  unsigned char magic[2] = {0, 0};
  const size_t n = std::fread(magic, 1, 2, file_);
  std::rewind(file_);
  if (n == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
    gz_ = std::make_unique<Inflater>();
    if (inflateInit2(&gz_->z, 15 + 32) != Z_OK) {
      std::fclose(file_);
      throw SystemError("inflateInit2", "zlib failed");
    }
  }
  setg(nullptr, nullptr, nullptr);
}

TextFileBuf::~TextFileBuf() {
  if (gz_) inflateEnd(&gz_->z);
  if (file_) std::fclose(file_);
}

TextFileBuf::int_type TextFileBuf::underflow() {
  if (gptr() < egptr()) return traits_type::to_int_type(*gptr());
  out_.resize(kBuffer);
  if (!gz_) {
    const size_t n = std::fread(out_.data(), 1, kBuffer, file_);
    if (n == 0) {
      if (std::ferror(file_)) throw SystemError("fread", path_ + ": read failed");
      return traits_type::eof();
    }
    setg(out_.data(), out_.data(), out_.data() + n);
    return traits_type::to_int_type(out_[0]);
  }
  Inflater& g = *gz_;
  z_stream& z = g.z;
  size_t produced = 0;
  auto fail = [&](int rc) {
    const size_t at = g.consumed - z.avail_in;
    const std::string msg = z.msg ? z.msg : "";
    (void)rc;
    throw Error(path_, "corrupt or truncated gzip data at compressed byte " + std::to_string(at) +
                           (msg.empty() ? "" : " (" + msg + ")"));
  };
  while (produced == 0 && !g.ended) {
    if (z.avail_in == 0 && !g.at_eof) {
      in_.resize(kBuffer);
      const size_t n = std::fread(in_.data(), 1, kBuffer, file_);
      if (n == 0 && std::ferror(file_)) throw SystemError("fread", path_ + ": read failed");
      if (n < kBuffer) g.at_eof = true;
      z.next_in = reinterpret_cast<Bytef*>(in_.data());
      z.avail_in = static_cast<uInt>(n);
      g.consumed += n;
    }
    if (z.avail_in == 0 && g.at_eof) {
      if (g.mid_member || g.consumed == 0) fail(Z_BUF_ERROR);  // ran out mid-stream
      g.ended = true;
      break;
    }
    z.next_out = reinterpret_cast<Bytef*>(out_.data());
    z.avail_out = static_cast<uInt>(kBuffer);
    const int rc = inflate(&z, Z_NO_FLUSH);
    produced = kBuffer - z.avail_out;
    if (rc == Z_STREAM_END) {
      g.mid_member = false;
      // Concatenated gzip members (gzip allows them): go on with the next one, if any.
      if (inflateReset(&z) != Z_OK) fail(rc);
      continue;
    }
    if (rc != Z_OK && !(rc == Z_BUF_ERROR && z.avail_in == 0)) fail(rc);
    g.mid_member = true;
  }
  if (produced == 0) return traits_type::eof();
  setg(out_.data(), out_.data(), out_.data() + produced);
  return traits_type::to_int_type(out_[0]);
}

std::string read_text_file(const std::string& path) {
  TextFileBuf buf(path);
  std::string text;
  char chunk[1 << 16];
  std::streamsize n;
  while ((n = buf.sgetn(chunk, sizeof chunk)) > 0) text.append(chunk, static_cast<size_t>(n));
  return text;
}

}  // namespace parasol::traces
