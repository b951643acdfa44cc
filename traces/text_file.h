// Reading a trace file's text, inflating it when it is gzip-compressed (torch.profiler's
// tensorboard_trace_handler writes "*.pt.trace.json.gz" with use_gzip): the importers read
// either form through TextFileBuf, whole or as a stream.
#pragma once

#include <cstdio>
#include <memory>
#include <streambuf>
#include <string>

namespace parasol::traces {

// The file's bytes as a stream buffer, inflated as they are read when the file begins with gzip's
// magic bytes (1f 8b; concatenated gzip members read as one), so that a reader of any size of file
// holds one buffer of it at a time (`std::istream in(&buf)`). A missing file is a parasol::Error
// naming the path (thrown by the constructor); a corrupt or truncated gzip stream an Error naming
// the path and the compressed byte offset where it failed, thrown by the read that meets it.
class TextFileBuf : public std::streambuf {
 public:
  explicit TextFileBuf(const std::string& path);
  ~TextFileBuf() override;
  TextFileBuf(const TextFileBuf&) = delete;
  TextFileBuf& operator=(const TextFileBuf&) = delete;

 protected:
  int_type underflow() override;

 private:
  struct Inflater;
  std::string path_;
  std::FILE* file_ = nullptr;
  std::unique_ptr<Inflater> gz_;  // null for a plain file
  std::string in_, out_;          // compressed input and the bytes handed out
};

// The whole file's bytes, read through TextFileBuf (its errors).
std::string read_text_file(const std::string& path);

}  // namespace parasol::traces
