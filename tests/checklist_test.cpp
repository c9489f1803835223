// `vericache checklist` (harness/checklist_command.cpp) and its trace (harness/checklist_trace.h).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checklist_trace.h"
#include "cli_runner.h"
#include "test_support.h"
#include "util/hdf5_table.h"

namespace vericache {
namespace {

using testing::CliRun;
using testing::run_vericache;

// The quick checklist on the default model and KVzip: four verdict lines, the measured steps 1, 2
// and 4 hold (every output token's distribution exactly full-KV decoding's: KL 0), and the trace in a new run folder has the documented layout — read by our reader and
// by h5py (harness/checklist/check_trace.py). Step 3 compares timings, so whether it holds is not
// asserted here (a loaded machine may fail it); that its line carries both numbers is, and that
// the exit status is 1 exactly when a verdict fails.
TEST(Checklist, QuickRunGivesVerdictsAndAReadableTrace) {
  const std::string out = testing::temp_dir() + "/runs";
  const CliRun r = run_vericache("checklist --quick --out-dir " + out);
  const std::string step3 = "iteration time, B = 2, each x predicted from the other runs: error ";
  const bool step3_holds = r.out.find("\n3. Throughput model  HOLDS         " + step3) != std::string::npos;
  const bool step3_fails = r.out.find("\n3. Throughput model  FAILS         " + step3) != std::string::npos;
  EXPECT_TRUE(step3_holds || step3_fails) << r.out;
  EXPECT_NE(r.out.find("; at x = 25 Eq. 3 predicts "), std::string::npos) << r.out;
  ASSERT_EQ(r.exit_code, step3_holds ? 0 : 1) << r.out << r.err;
  for (const char* line : {"\n1. KL growth         HOLDS         mean KL ", "\n2. Acceptance        HOLDS         gamma(x, c = 0.25) for x = 5: ", "; at x = 25, gamma by c 0.1: ",
                           "; gamma by temperature (sampled) 0.7: ", "; gamma by context (tokens) 1024: ",
                           "\n4. End-to-end        HOLDS         0 token mismatches in 48 tokens of 2 prompts (0 prompts differ); "
                           "KL(full-KV || VeriCache) per token over 48 tokens: mean 0, max 0 nats;"}) {
    EXPECT_NE(r.out.find(line), std::string::npos) << line << "\n" << r.out;
  }
  std::vector<std::string> traces;
  for (const auto& run : std::filesystem::directory_iterator(out)) traces.push_back(run.path().string() + "/trace.h5");
  ASSERT_EQ(traces.size(), 1u);
  const std::string trace = traces[0];
  EXPECT_NE(r.out.find("trace: " + trace + "\n"), std::string::npos) << r.out;
  EXPECT_EQ(std::filesystem::path(trace).parent_path().filename().string().rfind("checklist-", 0), 0u);

  auto attrs = cli::read_checklist_attributes(trace);
  ASSERT_TRUE(attrs.ok()) << attrs.status().message();
  EXPECT_EQ((*attrs)["compressor"], "kvzip");
  EXPECT_EQ((*attrs)["command"], "vericache checklist --quick --out-dir " + out);
  const auto config = nlohmann::json::parse((*attrs)["config"]);
  EXPECT_EQ(config["quick"], true);
  EXPECT_EQ(config["draft_lengths"], (std::vector<int64_t>{5, 10, 25}));
  EXPECT_EQ(config["ratios"], (std::vector<double>{0.1}));
  EXPECT_EQ(config["temperatures"], (std::vector<double>{0.7}));
  auto sweep_mismatches = read_hdf5_column(trace, "ratio_sweep/mismatches");
  ASSERT_TRUE(sweep_mismatches.ok());
  EXPECT_EQ(*sweep_mismatches, (std::vector<double>{0}));
  auto context_mismatches = read_hdf5_column(trace, "context_sweep/mismatches");
  ASSERT_TRUE(context_mismatches.ok());
  EXPECT_EQ(*context_mismatches, (std::vector<double>{0}));
  auto predicted = read_hdf5_column(trace, "throughput_model/predicted_iteration_s");
  ASSERT_TRUE(predicted.ok());
  ASSERT_EQ(predicted->size(), 3u);
  for (double t : *predicted) EXPECT_GT(t, 0.0);
  auto kl = read_hdf5_column(trace, "kl_growth/kl");
  ASSERT_TRUE(kl.ok());
  EXPECT_EQ(kl->size(), 2u * 32u);
  for (double v : *kl) EXPECT_GE(v, 0.0);
  auto token_kl = read_hdf5_column(trace, "end_to_end_kl/kl");
  ASSERT_TRUE(token_kl.ok());
  EXPECT_EQ(token_kl->size(), 48u);
  for (const char* column : {"acceptance_summary/mismatches", "end_to_end/mismatches", "end_to_end_kl/kl"}) {
    auto mismatches = read_hdf5_column(trace, column);
    ASSERT_TRUE(mismatches.ok()) << column;
    for (double v : *mismatches) EXPECT_EQ(v, 0.0) << column;
  }
  const std::string figures = std::filesystem::path(trace).parent_path().string() + "/figures";
  EXPECT_NE(r.out.find("figures: " + figures + " (8 PNG, each with its data as CSV)\n"), std::string::npos) << r.out;
  for (const char* name : {"kl_growth", "acceptance", "acceptance_position", "accepted_lengths", "acceptance_cliff",
                           "temperature", "context_length", "throughput_model"}) {
    for (const char* ext : {".png", ".csv"}) {
      EXPECT_GT(std::filesystem::file_size(figures + "/" + name + ext), 0u) << name << ext;
    }
  }
  std::ifstream acceptance_csv(figures + "/acceptance.csv");
  std::string header, row;
  std::getline(acceptance_csv, header);
  std::getline(acceptance_csv, row);
  EXPECT_EQ(header, "x,gamma,mean_accepted");
  EXPECT_EQ(row.rfind("5,", 0), 0u) << row;
  // `vericache figures RUN` redraws them from the trace alone.
  std::filesystem::remove_all(figures);
  const CliRun redraw = run_vericache("figures " + std::filesystem::path(trace).parent_path().string());
  EXPECT_EQ(redraw.exit_code, 0) << redraw.err;
  EXPECT_EQ(redraw.out.rfind(figures + "/kl_growth.png\n", 0), 0u) << redraw.out;
  EXPECT_TRUE(std::filesystem::exists(figures + "/throughput_model.png"));
  const CliRun h5py = testing::run_command(std::string(VC_PYTHON) + " " + testing::source_path("harness/checklist/check_trace.py") + " " + trace);
  EXPECT_EQ(h5py.exit_code, 0) << h5py.out << h5py.err;
  EXPECT_EQ(h5py.out.rfind("trace OK: " + trace, 0), 0u) << h5py.out;
}

// `vericache figures` names what is wrong: no run, no trace, a trace of another version, a Python
// without matplotlib.
TEST(Checklist, FiguresErrorsSayWhatToDo) {
  const std::string dir = testing::temp_dir();
  const CliRun none = run_vericache("figures");
  EXPECT_EQ(none.exit_code, 2);
  EXPECT_EQ(none.err, "vericache figures: name the run folder (or its trace.h5)\nRun 'vericache figures --help' for the options.\n");
  const CliRun missing = run_vericache("figures " + dir);
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "vericache: error: " + dir + "/trace.h5: no such trace (a checklist run folder holds trace.h5)\n");
  Hdf5Table old{{"kl_growth/kl"}, {{0.1}}, {{"format", "vericache-checklist"}, {"version", "1"}}};
  ASSERT_TRUE(write_hdf5_table(dir + "/trace.h5", old).ok());
  const CliRun v1 = run_vericache("figures " + dir);
  EXPECT_EQ(v1.exit_code, 1);
  EXPECT_EQ(v1.err, "vericache: error: " + dir + "/trace.h5: checklist trace version 1; this vericache reads version 2\n");
  const CliRun two = run_vericache("figures " + dir + " " + dir);
  EXPECT_EQ(two.exit_code, 2);
  EXPECT_EQ(two.err, "vericache figures: too many positional options have been specified on the command line\n"
                     "Run 'vericache figures --help' for the options.\n");
}

// Prompt sets are checked before the model loads, with what to do.
TEST(Checklist, PromptSetErrorsSayWhatToDo) {
  const std::string dir = testing::temp_dir();
  const CliRun missing = run_vericache("checklist --prompt-set " + dir + "/none.json");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err, "vericache: error: " + dir + "/none.json: cannot read the prompt set (the long-code set is made "
                         "by harness/setup.sh, or python3 datasets/long_code/build_prompts.py)\n");
  std::ofstream(dir + "/one.json") << R"({"prompts": [{"name": "a", "chat": false, "text": "hello"}]})";
  const CliRun few = run_vericache("checklist --prompts 3 --prompt-set " + dir + "/one.json");
  EXPECT_EQ(few.exit_code, 2);
  EXPECT_EQ(few.err, "vericache checklist: " + dir + "/one.json has 1 prompts, 3 asked (--prompts)\n"
                     "Run 'vericache checklist --help' for the options.\n");
  std::ofstream(dir + "/shape.json") << R"({"prompts": [{"text": "no chat flag"}]})";
  const CliRun shape = run_vericache("checklist --prompts 1 --prompt-set " + dir + "/shape.json");
  EXPECT_EQ(shape.exit_code, 2);
  EXPECT_EQ(shape.err, "vericache checklist: " + dir + "/shape.json: prompt 0 needs \"text\" (string) and \"chat\" "
                       "(boolean)\nRun 'vericache checklist --help' for the options.\n");
}

// A trace of another version or format is refused by name; columns of one group must agree in length.
TEST(Checklist, TraceReaderRefusesOtherVersionsAndFormats) {
  const std::string dir = testing::temp_dir();
  Hdf5Table t{{"kl_growth/kl"}, {{0.1, 0.2}}, {{"format", "vericache-checklist"}, {"version", "1"}}};
  ASSERT_TRUE(write_hdf5_table(dir + "/v1.h5", t).ok());
  EXPECT_EQ(cli::read_checklist_attributes(dir + "/v1.h5").status().message(),
            dir + "/v1.h5: checklist trace version 1; this vericache reads version 2");
  t.attributes = {{"format", "vericache-sweep"}, {"version", "1"}};
  ASSERT_TRUE(write_hdf5_table(dir + "/sweep.h5", t).ok());
  EXPECT_EQ(cli::read_checklist_attributes(dir + "/sweep.h5").status().message(),
            dir + "/sweep.h5: a 'vericache-sweep' file, not a checklist trace (vericache-checklist)");
  Hdf5Table uneven{{"a/x", "a/y", "b/z"}, {{1, 2}, {1}, {1, 2, 3}}, {}};
  EXPECT_EQ(write_hdf5_table(dir + "/uneven.h5", uneven).message(),
            dir + "/uneven.h5: columns of different lengths in one group ('a/x', 'a/y')");
  uneven.columns[1] = {1, 2};
  ASSERT_TRUE(write_hdf5_table(dir + "/groups.h5", uneven).ok());
  EXPECT_EQ(*read_hdf5_column(dir + "/groups.h5", "b/z"), (std::vector<double>{1, 2, 3}));
}

}  // namespace
}  // namespace vericache
