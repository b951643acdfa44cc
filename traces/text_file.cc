// read_text_file: plain bytes, or gzip inflated through zlib.
#include "traces/text_file.h"

#include <zlib.h>

#include <algorithm>
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
  // zlib counts its input in uInt (32 bits): inputs of 4 GiB or more are fed in chunks.
  constexpr size_t kChunk = size_t{1} << 30;
  size_t fed = std::min(in.size(), kChunk);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = static_cast<uInt>(fed);
  int rc = Z_OK;
  while (true) {
    if (z.avail_in == 0 && fed < in.size()) {
      const size_t more = std::min(in.size() - fed, kChunk);
      z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data() + fed));
      z.avail_in = static_cast<uInt>(more);
      fed += more;
    }
    z.next_out = reinterpret_cast<Bytef*>(buf);
    z.avail_out = sizeof buf;
    rc = inflate(&z, Z_NO_FLUSH);
    out.append(buf, sizeof buf - z.avail_out);
    if (rc == Z_STREAM_END) {
      if (z.avail_in == 0 && fed == in.size()) break;
      // Concatenated gzip members (gzip allows them): go on with the next one.
      if (inflateReset(&z) != Z_OK) break;
      continue;
    }
    if (rc != Z_OK) break;
    if (z.avail_in == 0 && fed == in.size() && z.avail_out != 0) break;  // ran out mid-stream
  }
  const size_t at = fed - z.avail_in;
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
