// The subcommands of the `vericache` binary. Each parses its own options (argv[0] is the
// subcommand name) and returns an exit code from cli_common.h.
#pragma once

namespace vericache::cli {

int run_generate(int argc, char** argv);
int run_bench(int argc, char** argv);
int run_plugins(int argc, char** argv);
int run_compress(int argc, char** argv);
int run_conformance(int argc, char** argv);
int run_checklist(int argc, char** argv);
int run_figures(int argc, char** argv);
int run_train_kvzap(int argc, char** argv);
int run_calibrate(int argc, char** argv);
int run_run(int argc, char** argv);
int run_bench_engine(int argc, char** argv);
int run_bench_budget(int argc, char** argv);
int run_bench_attention(int argc, char** argv);
int run_bench_acceptance(int argc, char** argv);
int run_model(int argc, char** argv);
int run_simulate(int argc, char** argv);
int run_bench_reload(int argc, char** argv);
int run_sweep(int argc, char** argv);

}  // namespace vericache::cli
