// Writing result files (weights, traces, tables) so that a kill, a full disk or a bad path never
// leaves a half-written file over a good one, and so that a bad destination is known before a
// long computation starts.
//
// Thread-safety: both functions are safe to call concurrently for different paths. Failure: an
// IOError / InvalidArgument status naming the path and the operating system's reason.
#pragma once

#include <string>
#include <string_view>

#include <vericache/status.h>

namespace vericache {

// Checks that `path` can be written now: it is not a directory, its folder exists, and a file can
// be created in that folder (a probe file is created and removed).
Status check_output_path(const std::string& path);

// Writes `contents` to a temporary file beside `path`, flushes it to disk and renames it over
// `path`: readers see the old file or the whole new one. The temporary file is removed on failure.
Status write_file_atomically(const std::string& path, std::string_view contents);

}  // namespace vericache
