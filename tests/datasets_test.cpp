// The prompt sets of datasets/ (harness/prompt_set.h): the sets set-up builds match what their
// READMEs record (prompt count, bytes, SHA-256: the builders are deterministic and pinned), and
// every set loads through the one C++ loader.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "cli_runner.h"
#include "prompt_set.h"
#include "test_support.h"

namespace vericache {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(Datasets, BuiltPromptSetsMatchTheirReadmes) {
  for (const char* set : {"long_code", "long_docs", "code_tasks", "function_calling"}) {
    SCOPED_TRACE(set);
    const std::string dir = testing::source_path(std::string("datasets/") + set);
    const std::string readme = read_text(dir + "/README.md");
    std::smatch m;
    ASSERT_TRUE(std::regex_search(readme, m, std::regex(R"((\d+) prompts, ([\d,]+) bytes, SHA-256\s+`([0-9a-f]{64})`)")))
        << "the README records no size and checksum";
    const std::string path = dir + "/prompts.json";
    ASSERT_TRUE(std::filesystem::exists(path)) << path << " is missing: harness/setup.sh builds it";
    auto prompts = cli::read_prompt_set(path);
    ASSERT_TRUE(prompts.ok()) << prompts.status().message();
    EXPECT_EQ(static_cast<int64_t>(prompts->size()), std::stoll(m[1].str()));
    EXPECT_EQ(std::to_string(std::filesystem::file_size(path)), std::regex_replace(m[2].str(), std::regex(","), ""));
    const testing::CliRun sum = testing::run_command("sha256sum " + path);
    EXPECT_EQ(sum.out.substr(0, 64), m[3].str());
    for (const cli::PromptEntry& p : *prompts) {
      EXPECT_FALSE(p.name.empty());
      EXPECT_TRUE(p.chat);
      EXPECT_GT(p.text.size(), 100u) << p.name;
    }
  }
}

TEST(Datasets, TheLoaderSaysWhatIsWrong) {
  const std::string dir = testing::temp_dir();
  EXPECT_EQ(cli::read_prompt_set(dir + "/none.json").status().message(),
            dir + "/none.json: cannot read the prompt set (the long-code, long-docs, code-task and function-calling "
                  "sets are made by harness/setup.sh, or python3 datasets/<set>/build_prompts.py)");
  std::ofstream(dir + "/array.json") << "[1, 2]";
  EXPECT_EQ(cli::read_prompt_set(dir + "/array.json").status().message(),
            dir + "/array.json: not a prompt set (a JSON object with a \"prompts\" array)");
  auto lossless = cli::read_prompt_set(testing::source_path("datasets/lossless_prompts/prompts.json"), 4);
  ASSERT_TRUE(lossless.ok());
  EXPECT_EQ(lossless->size(), 4u);
}

}  // namespace
}  // namespace vericache
