// read_text_file: plain bytes, or gzip inflated through zlib.
#include "traces/text_file.h"

#include <zlib.h>

#include <fstream>
#include <sstream>

#include "core/error.h"

namespace parasol::traces {

namespace {

std::string inflate_gzip(const std::string& in, const std::string& path) {
  z_stream z{};
  if (inflateInit2(&z, 15 + 32) != Z_OK) throw SystemError("inflateInit2", "zlib failed");
  std::string out;
  char buf[1 << 16];
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(in.size());
  int rc = Z_OK;
  while (true) {
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0) break;
      // Concatenated gzip members (gzip allows them): go on with the next one.
      if (inflateReset(&z) != Z_OK) break;
      continue;
    }
    if (rc != Z_OK) break;
    if (z.avail_in == 0 && z.avail_out != 0) break;  // input ran out mid-stream
  }
  const size_t at = in.size() - z.avail_in;
  const std::string msg = z.msg ? z.msg : "";
  inflateEnd(&z);
  if (rc != Z_STREAM_END)
    throw Error(path, "corrupt or truncated gzip data at compressed byte " + std::to_string(at) +
                          (msg.empty() ? "" : " (" + msg + ")"));
  return out;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(path, "cannot open file");
  std::stringstream s;
  s << f.rdbuf();
  std::string text = s.str();
  if (text.size() >= 2 && static_cast<unsigned char>(text[0]) == 0x1f &&
      static_cast<unsigned char>(text[1]) == 0x8b)
    return inflate_gzip(text, path);
  return text;
}

}  // namespace parasol::traces
