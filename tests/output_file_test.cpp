// Result files are written whole or not at all, and bad destinations are named before work starts.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "test_support.h"
#include "util/output_file.h"

namespace vericache {
namespace {

TEST(OutputFile, ReplacesAnExistingFileWholeAndLeavesNoTemporaryFile) {
  const std::string dir = testing::temp_dir();
  const std::string path = dir + "/weights.json";
  std::ofstream(path) << "old";
  ASSERT_TRUE(write_file_atomically(path, "new contents\n").ok());
  EXPECT_EQ(testing::read_file(path), "new contents\n");
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
}

TEST(OutputFile, AFailedWriteKeepsTheOldFile) {
  const std::string dir = testing::temp_dir();
  const std::string path = dir + "/weights.json";
  std::ofstream(path) << "good";
  // A directory where the temporary file would go makes the write fail after the old file exists.
  std::filesystem::create_directory(path + ".tmp-" + std::to_string(::getpid()));
  const Status s = write_file_atomically(path, "half");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_EQ(s.message(), path + ": cannot create a file beside it: Is a directory");
  EXPECT_EQ(testing::read_file(path), "good");
}

TEST(OutputFile, BadDestinationsAreNamedWithTheSystemsReason) {
  const std::string dir = testing::temp_dir();
  EXPECT_TRUE(check_output_path(dir + "/fine.json").ok());
  EXPECT_FALSE(std::filesystem::exists(dir + "/fine.json"));
  EXPECT_EQ(check_output_path(dir).message(), dir + ": is a directory; give a file name");
  EXPECT_EQ(check_output_path(dir + "/missing/x.json").message(),
            dir + "/missing/x.json: cannot use the folder " + dir + "/missing: No such file or directory");
  std::ofstream(dir + "/plain") << "x";
  EXPECT_EQ(check_output_path(dir + "/plain/x.json").message(), dir + "/plain/x.json: " + dir + "/plain is not a folder");
  EXPECT_EQ(write_file_atomically(dir + "/missing/x.json", "x").message(),
            dir + "/missing/x.json: cannot create a file beside it: No such file or directory");
}

}  // namespace
}  // namespace vericache
