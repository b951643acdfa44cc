// Tests of traces/text_file: gzip traces inflated a buffer at a time (TextFileBuf), whatever the
// file's size. Gzip inputs of 4 GiB or more were once truncated (zlib's avail_in is 32 bits and
// the whole file was handed over at once); the reader now never hands zlib more than one
// buffer, so a file that spans many input and output buffers exercises the same path as a
// 4 GiB one does.
#include "traces/text_file.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/error.h"

namespace parasol::traces {
namespace {

// `text` as one gzip member (deflate with gzip's header and trailer).
std::string gzip_member(const std::string& text, int level) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, text.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(text.data()));
  z.avail_in = static_cast<uInt>(text.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// Bytes that do not compress (a 64-bit linear congruential generator), so the compressed file is
// as large as the text and spans several of the reader's input buffers.
std::string incompressible(size_t n, uint64_t seed) {
  std::string s(n, '\0');
  for (char& c : s) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    c = static_cast<char>(seed >> 56);
  }
  return s;
}

std::string temp_file(const std::string& name, const std::string& bytes) {
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

TEST(TextFile, AGzipSpanningManyBuffersAndMembersInflatesWhole) {
  // Three members: incompressible (about 2.5 MiB compressed: three input buffers), highly
  // compressible (a few KiB that inflate to 5 MiB: many output buffers from one input buffer),
  // and a small one ending the file.
  const std::string a = incompressible((size_t{5} << 19) + 12345, 1);
  const std::string b(size_t{5} << 20, 'x');
  const std::string c = "{\"traceEvents\": []}\n";
  const std::string gz = gzip_member(a, 6) + gzip_member(b, 9) + gzip_member(c, 1);
  ASSERT_GT(gz.size(), size_t{2} << 20);
  const std::string path = temp_file("parasol_text_file_many_buffers.json.gz", gz);
  const std::string text = read_text_file(path);
  ASSERT_EQ(text.size(), a.size() + b.size() + c.size());
  EXPECT_TRUE(text == a + b + c);
  std::filesystem::remove(path);
}

TEST(TextFile, AGzipCutAfterItsFirstBufferIsNamedTruncated) {
  const std::string gz = gzip_member(incompressible(size_t{3} << 20, 7), 6);
  const std::string path =
      temp_file("parasol_text_file_cut.json.gz", gz.substr(0, (size_t{3} << 19)));
  try {
    read_text_file(path);
    ADD_FAILURE() << "a truncated gzip file was read without an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated gzip data"), std::string::npos) << e.what();
  }
  std::filesystem::remove(path);
}

TEST(TextFile, APlainFileLargerThanABufferIsReadWhole) {
  const std::string a = incompressible((size_t{3} << 20) + 7, 3);
  const std::string path = temp_file("parasol_text_file_plain.json", a);
  EXPECT_TRUE(read_text_file(path) == a);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace parasol::traces
