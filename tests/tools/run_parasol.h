// Runs the parasol executable (PARASOL_BIN, set by tests/tools/CMakeLists.txt) as a user would
// and returns its exit code and output, for the command-line tests of tests/tools/.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace parasol::testing_cli {

struct Result {
  int code;         // the exit status, -1 when the process did not exit normally
  std::string out;  // stdout and stderr together
};

inline Result run(const std::string& args) {
  std::string cmd = std::string(PARASOL_BIN) + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) out.append(buf.data(), n);
  int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

}  // namespace parasol::testing_cli
