"""The layout of a `vericache checklist` trace, as harness/checklist_trace.h documents it: what
check_trace.py checks, figures.py and paper_figures.py read."""
import h5py

FORMAT, VERSION = "vericache-checklist", "3"

ATTRIBUTES = ["format", "version", "command", "git_commit", "model_file", "model_fingerprint", "compressor",
              "plugin_path", "config", "seed", "hardware", "libraries", "verdicts"]
GROUPS = {
    "kl_growth": ["prompt", "step", "kl", "same_argmax", "cumulative_kl"],
    "kl_growth_mean": ["step", "mean_cumulative_kl", "fit"],
    "acceptance": ["x", "request", "drafted", "accepted"],
    "acceptance_position": ["x", "position", "drafted", "accepted"],
    "acceptance_summary": ["x", "gamma", "mean_accepted", "tokens", "mismatches"],
    "ratio_sweep": ["ratio", "x", "gamma", "mean_accepted", "tokens", "mismatches", "compressor_failures", "tok_s"],
    "temperature_sweep": ["temperature", "ratio", "x", "gamma", "mean_accepted", "tokens", "compressor_failures", "tok_s"],
    "context_sweep": ["context", "prompt_tokens", "prompts", "ratio", "x", "gamma", "mean_accepted", "tokens",
                      "mismatches", "compressor_failures", "tok_s"],
    "context_sweep_prompt": ["context", "prompt", "gamma", "mismatches"],
    "end_to_end": ["prompt", "prompt_tokens", "generated", "mismatches", "first_mismatch"],
    "decode_speed": ["mode", "requests", "tokens", "seconds", "tok_s", "mismatches", "kv_bytes"],
    "end_to_end_kl": ["prompt", "position", "kl"],
    "fixed_budget": ["side", "budget_pages", "pages_per_request", "batch", "concurrent", "tokens", "seconds", "tok_s",
                     "mismatches"],
    "iterations": ["x", "seconds", "draft_items", "verify_items", "rows", "kv_slots_read"],
    "throughput_model": ["x", "measured_iteration_s", "predicted_iteration_s", "error", "eq3_bytes_s", "request_s",
                         "row_s", "bandwidth_bytes_per_s", "weight_bytes", "kv_full_bytes", "calibration_forwards",
                         "measured_forwards"],
}
# decode_speed/mode
DECODE_MODES = ["full KV", "compressed cache alone", "VeriCache"]


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def attributes(f):
    return {k: text(v) for k, v in f.attrs.items()}


def format_problem(attrs):
    """None for a trace of this layout, else what it is instead."""
    if attrs.get("format") != FORMAT or attrs.get("version") != VERSION:
        return f"format {attrs.get('format')} version {attrs.get('version')}, expected {FORMAT} {VERSION}"
    return None


def group(f, name):
    """A group's columns as arrays, None when the trace lacks it."""
    return {column: f[name][column][:] for column in f[name]} if name in f else None


def open_trace(path):
    return h5py.File(path, "r")
