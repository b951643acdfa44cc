// Reading a trace file's text, inflating it when it is gzip-compressed (torch.profiler's
// tensorboard_trace_handler writes "*.pt.trace.json.gz" with use_gzip): the importers read
// either form through this one function.
#pragma once

#include <string>

namespace parasol::traces {

// The file's bytes, inflated when they begin with gzip's magic bytes (1f 8b). A missing file is a
// parasol::Error naming the path; a corrupt or truncated gzip stream an Error naming the path
// and the compressed byte offset where it failed.
std::string read_text_file(const std::string& path);

}  // namespace parasol::traces
