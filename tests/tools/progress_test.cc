// Tests the progress bar (tools/progress.h) and `parasol search`'s use of it: drawn only when
// enabled and past its delay, erased at the end; never on a stderr that is not a terminal; on a
// terminal (a pseudo-terminal from script(1)) when the search runs past a second.
#include "tools/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "tests/tools/run_parasol.h"

namespace parasol::tools {
namespace {

// What `draw` writes to a ProgressBar's stream.
template <class F>
std::string captured(F draw) {
  std::FILE* f = std::tmpfile();
  draw(f);
  std::fflush(f);
  std::rewind(f);
  std::string s;
  for (int c; (c = std::fgetc(f)) != EOF;) s += static_cast<char>(c);
  std::fclose(f);
  return s;
}

TEST(ProgressBar, DrawsWhenEnabledAndPastItsDelayThenErasesItself) {
  bool drawn = false;
  const std::string s = captured([&](std::FILE* f) {
    ProgressBar bar(f, true, "searching", 0.0);
    bar.update(0.5);
    bar.update(0.5);  // same percentage: no redraw
    bar.update(1.0);
    drawn = bar.drawn();
    bar.finish();
    bar.update(0.7);  // after finish: nothing
  });
  EXPECT_TRUE(drawn);
  const std::string half = "\rsearching [" + std::string(15, '#') + std::string(15, ' ') + "]  50%";
  const std::string full = "\rsearching [" + std::string(30, '#') + "] 100%";
  EXPECT_EQ(s.find(half), 0u) << s;
  EXPECT_EQ(s.find(half, 1), std::string::npos) << s;
  EXPECT_EQ(s.find(full), half.size()) << s;
  // The erasing line: blanks over the bar, back to the line's start.
  const std::string erase = "\r" + std::string(std::string("searching").size() + 38, ' ') + "\r";
  EXPECT_EQ(s.substr(half.size() + full.size()), erase);
}

TEST(ProgressBar, DrawsNothingWhenDisabledOrQuickerThanItsDelay) {
  EXPECT_EQ(captured([](std::FILE* f) {
              ProgressBar bar(f, false, "searching", 0.0);
              bar.update(0.5);
              bar.update(1.0);
            }),
            "");
  EXPECT_EQ(captured([](std::FILE* f) {
              ProgressBar bar(f, true, "searching", 60.0);
              bar.update(0.5);
              bar.update(1.0);
              EXPECT_FALSE(bar.drawn());
            }),
            "");
}

TEST(ProgressBar, ClampsFractions) {
  const std::string s = captured([](std::FILE* f) {
    ProgressBar bar(f, true, "x", 0.0);
    bar.update(-1);
    bar.update(7);
  });
  EXPECT_NE(s.find("[" + std::string(30, ' ') + "]   0%"), std::string::npos) << s;
  EXPECT_NE(s.find("[" + std::string(30, '#') + "] 100%"), std::string::npos) << s;
}

TEST(ProgressBar, IsNotATerminalForAFile) {
  std::FILE* f = std::tmpfile();
  EXPECT_FALSE(stream_is_terminal(f));
  std::fclose(f);
}

// A search of a few seconds on 2 cores (Llama 3 70B on 1024 H100s), one thread.
const std::string kLongSearch =
    "search --model llama3-70b --cluster dgx-h100 --gpus 1024 --gbs 1024 --threads 1 --json";

std::string temp_path(const std::string& name) {
  return (testing::TempDir().empty() ? std::string("/tmp/") : testing::TempDir()) + name;
}

// The exit code and output of a shell command line.
testing_cli::Result shell(const std::string& cmd) {
  FILE* pipe = popen(cmd.c_str(), "r");
  std::string out;
  for (int c; (c = std::fgetc(pipe)) != EOF;) out += static_cast<char>(c);
  const int status = pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

TEST(SearchCommandProgress, NoBarWhenStderrIsNotATerminal) {
  const std::string err = temp_path("progress_test_stderr.txt");
  const std::string out = temp_path("progress_test_stdout.json");
  const std::string cmd = std::string(PARASOL_BIN) + " " + kLongSearch + " > " + out + " 2> " + err;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::stringstream e, o;
  e << std::ifstream(err).rdbuf();
  o << std::ifstream(out).rdbuf();
  EXPECT_EQ(e.str(), "");
  const nlohmann::json j = nlohmann::json::parse(o.str());  // stdout is the JSON alone
  EXPECT_GT(j["seconds"].get<double>(), 0);
}

TEST(SearchCommandProgress, BarOnATerminalWhenTheSearchRunsPastASecond) {
  if (std::system("script --version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no script(1)";
  // script(1) runs the command on a pseudo-terminal (stdout and stderr both) and copies it out.
  const std::string inner = std::string(PARASOL_BIN) + " " + kLongSearch;
  testing_cli::Result r = shell("script -qefc '" + inner + "' /dev/null");
  ASSERT_EQ(r.code, 0) << r.out;
  const size_t brace = r.out.find('{');
  ASSERT_NE(brace, std::string::npos) << r.out;
  const std::string before = r.out.substr(0, brace);
  const double seconds = nlohmann::json::parse(r.out.substr(brace))["seconds"].get<double>();
  if (seconds < 1.5) GTEST_SKIP() << "the search took " << seconds << " s: too quick for a bar";
  EXPECT_NE(before.find("\rsearching ["), std::string::npos) << before;
  EXPECT_NE(before.find("100%"), std::string::npos) << before;
}

}  // namespace
}  // namespace parasol::tools
