// The trace of one `vericache checklist` run: an HDF5 file (util/hdf5_table.h: float64 columns,
// string attributes on the root group), written once at the end of the run beside its destination
// and renamed over it, so an interrupted run leaves no half-written trace.
//
// Layout "vericache-checklist", version 3 (version 2 lacked decode_speed/; version 1 also the
// sweeps, end_to_end_kl/, iterations/ and throughput_model/).
// Root attributes (strings):
//   format "vericache-checklist"; version "3"; command; git_commit (of the source tree, or
//   "unknown"); model_file; model_fingerprint; compressor; plugin_path; config (the run's options,
//   JSON); seed; hardware (CPU model and threads); libraries (JSON: vericache, torch, hdf5);
//   verdicts (JSON: one object per step with "step", "name", "holds", "summary").
// Groups and columns (one row per ...):
//   kl_growth/            prompt, step, kl, same_argmax, cumulative_kl      (prompt and decode step)
//   kl_growth_mean/       step, mean_cumulative_kl, fit                     (step: the mean over prompts
//                                                                            and the linear fit's value)
//   acceptance/           x, request, drafted, accepted                     (verify window)
//   acceptance_position/  x, position, drafted, accepted                    (draft position in a window)
//   acceptance_summary/   x, gamma, mean_accepted, tokens, mismatches       (draft length)
//   ratio_sweep/          ratio, x, gamma, mean_accepted, tokens, mismatches, compressor_failures, tok_s
//                                                                           (kept fraction c, greedy, at x;
//                                                                            tok_s: decode tokens/s)
//   temperature_sweep/    temperature, ratio, x, gamma, mean_accepted, tokens, compressor_failures, tok_s
//                                                                           (temperature, sampled, at c, x)
//   context_sweep/        context, prompt_tokens, prompts, ratio, x, gamma, mean_accepted, tokens,
//                         mismatches, compressor_failures, tok_s            (prompt length, greedy, at c, x;
//                                                                            its prompts run together, pooled)
//   context_sweep_prompt/ context, prompt, gamma, mismatches                 (prompt of a length)
//   (compressor failures: requests whose compressor failed and that decoded on full KV instead)
//   end_to_end/           prompt, prompt_tokens, generated, mismatches, first_mismatch (-1: none)
//                         (step 4's run with the config's draft_policy; "fixed" in traces without one)
//   decode_speed/         mode (0 full KV, 1 the compressed cache alone, 2 VeriCache), requests, tokens,
//                         seconds, tok_s, mismatches, kv_bytes               (decoding mode at (c, x), every
//                                                                            request in one batch: tokens after
//                                                                            each request's first over the decode
//                                                                            wall time; mismatches: greedy tokens
//                                                                            unlike full-KV decoding's; kv_bytes:
//                                                                            the caches' bytes at the end)
//   end_to_end_kl/        prompt, position, kl                              (output token of the end-to-end
//                                                                            run: KL(p_full || p_VeriCache)
//                                                                            of its distribution, nats)
//   fixed_budget/         side (0 full KV, 1 VeriCache), budget_pages, pages_per_request, batch,
//                         concurrent, tokens, seconds, tok_s, mismatches    (side of step 4's fixed-budget run:
//                                                                            pages_per_request a whole cache or
//                                                                            VeriCache's compressed one at its
//                                                                            worst; concurrent: the most requests
//                                                                            in one decode forward; only when the
//                                                                            config's budget_full_requests > 0;
//                                                                            absent in traces made before it)
//   iterations/           x, seconds, draft_items, verify_items, rows, kv_slots_read
//                                                                           (decode forward of an engine run)
//   throughput_model/     x, measured_iteration_s, predicted_iteration_s, error (relative),
//                         eq3_bytes_s, request_s, row_s, bandwidth_bytes_per_s (0: unresolved),
//                         weight_bytes, kv_full_bytes, calibration_forwards, measured_forwards
//                                                                           (draft length predicted;
//                                                                            absent when step 3 was
//                                                                            not measured)
// Figures and checks read it with h5py (harness/checklist/); our reader below checks the layout.
//
// Thread-safety: one call at a time. Failure: IOError / NotFound from the HDF5 layer naming the
// file; InvalidArgument for a file of another format or of a version this build does not read.
#pragma once

#include <map>
#include <string>

#include <vericache/status.h>

#include "util/hdf5_table.h"

namespace vericache::cli {

inline constexpr const char* kChecklistFormat = "vericache-checklist";
inline constexpr int kChecklistVersion = 3;

// Writes `table` (its columns as above) with the format and version attributes added.
Status write_checklist_trace(const std::string& path, Hdf5Table table);

// The root attributes of a checklist trace, after checking its format and version.
Result<std::map<std::string, std::string>> read_checklist_attributes(const std::string& path);

}  // namespace vericache::cli
