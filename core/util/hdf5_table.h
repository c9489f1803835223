// Tables as HDF5 files, for the harness (h5py) to read and draw: one 1-D float64 dataset per
// column, and string attributes on the root group (what made the file: command, profiles). A
// column named "group/name" lives in that group (created as needed); the columns of one group
// (the root included) have one length. Written beside the destination and renamed over it, so a kill or a
// full disk never leaves half a file over a good one.
//
// Thread-safety: the HDF5 library is used from one thread at a time (Debian's build is
// thread-safe, but nothing here needs more). Failure: IOError naming the path when the file cannot
// be created or read; NotFound for a missing column or attribute; InvalidArgument for columns of
// different lengths in one group.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include <vericache/status.h>

namespace vericache {

struct Hdf5Table {
  std::vector<std::string> names;            // dataset names, in order
  std::vector<std::vector<double>> columns;  // one per name, equal lengths
  std::vector<std::pair<std::string, std::string>> attributes;
};

Status write_hdf5_table(const std::string& path, const Hdf5Table& table);
// One column / one string attribute of a file write_hdf5_table() wrote.
Result<std::vector<double>> read_hdf5_column(const std::string& path, const std::string& name);
Result<std::string> read_hdf5_attribute(const std::string& path, const std::string& name);
// The HDF5 library's version, "1.10.8".
std::string hdf5_library_version();

}  // namespace vericache
