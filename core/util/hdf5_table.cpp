#include "util/hdf5_table.h"

#include <hdf5.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace vericache {
namespace {

// Closes an HDF5 handle when it leaves scope.
class Handle {
 public:
  Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  ~Handle() {
    if (id_ >= 0) close_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*close_)(hid_t);
};

// HDF5 prints a stack of errors to stderr by default; failures here are reported as values.
void silence_hdf5() { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); }

Status write_to(const std::string& path, const Hdf5Table& table) {
  Handle file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return Status::io_error(path + ": cannot create the HDF5 file");
  Handle links(H5Pcreate(H5P_LINK_CREATE), H5Pclose);  // "group/column" creates the group
  H5Pset_create_intermediate_group(links.get(), 1);
  for (size_t i = 0; i < table.names.size(); ++i) {
    const hsize_t dims[1] = {table.columns[i].size()};
    Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
    Handle set(H5Dcreate2(file.get(), table.names[i].c_str(), H5T_IEEE_F64LE, space.get(), links.get(), H5P_DEFAULT,
                          H5P_DEFAULT),
               H5Dclose);
    if (!space.ok() || !set.ok() ||
        H5Dwrite(set.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, table.columns[i].data()) < 0) {
      return Status::io_error(path + ": cannot write column '" + table.names[i] + "'");
    }
  }
  for (const auto& [name, value] : table.attributes) {
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
    Handle space(H5Screate(H5S_SCALAR), H5Sclose);
    Handle attr(H5Acreate2(file.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    const std::string padded = value.empty() ? std::string(1, '\0') : value;
    if (!attr.ok() || H5Awrite(attr.get(), type.get(), padded.data()) < 0) {
      return Status::io_error(path + ": cannot write attribute '" + name + "'");
    }
  }
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0) return Status::io_error(path + ": cannot flush the HDF5 file");
  return Status();
}

}  // namespace

Status write_hdf5_table(const std::string& path, const Hdf5Table& table) {
  silence_hdf5();
  if (table.columns.size() != table.names.size()) {
    return Status::invalid_argument(path + ": " + std::to_string(table.names.size()) + " names for " +
                                    std::to_string(table.columns.size()) + " columns");
  }
  auto group_of = [](const std::string& name) { return name.substr(0, name.rfind('/') + 1); };
  for (size_t i = 0; i < table.names.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (group_of(table.names[i]) == group_of(table.names[j]) && table.columns[i].size() != table.columns[j].size()) {
        return Status::invalid_argument(path + ": columns of different lengths in one group ('" + table.names[j] +
                                        "', '" + table.names[i] + "')");
      }
    }
  }
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
  Status s = write_to(tmp, table);
  if (s.ok() && std::rename(tmp.c_str(), path.c_str()) != 0)
    s = Status::io_error(path + ": cannot rename the written file over it");
  if (!s.ok()) std::remove(tmp.c_str());
  return s;
}

Result<std::vector<double>> read_hdf5_column(const std::string& path, const std::string& name) {
  silence_hdf5();
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return Status::io_error(path + ": cannot open as an HDF5 file");
  if (H5Lexists(file.get(), name.c_str(), H5P_DEFAULT) <= 0)
    return Status::not_found(path + ": no column '" + name + "'");
  Handle set(H5Dopen2(file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  Handle space(H5Dget_space(set.get()), H5Sclose);
  if (!set.ok() || !space.ok() || H5Sget_simple_extent_ndims(space.get()) != 1) {
    return Status::io_error(path + ": '" + name + "' is not a 1-D dataset");
  }
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  std::vector<double> out(n);
  if (n > 0 && H5Dread(set.get(), H5T_NATIVE_DOUBLE, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) {
    return Status::io_error(path + ": cannot read '" + name + "'");
  }
  return out;
}

Result<std::string> read_hdf5_attribute(const std::string& path, const std::string& name) {
  silence_hdf5();
  Handle file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), H5Fclose);
  if (!file.ok()) return Status::io_error(path + ": cannot open as an HDF5 file");
  if (H5Aexists(file.get(), name.c_str()) <= 0) return Status::not_found(path + ": no attribute '" + name + "'");
  Handle attr(H5Aopen(file.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (!attr.ok() || !type.ok() || H5Tget_class(type.get()) != H5T_STRING) {
    return Status::io_error(path + ": attribute '" + name + "' is not a string");
  }
  std::string value(H5Tget_size(type.get()), '\0');
  if (H5Aread(attr.get(), type.get(), value.data()) < 0) return Status::io_error(path + ": cannot read '" + name + "'");
  while (!value.empty() && value.back() == '\0') value.pop_back();
  return value;
}

std::string hdf5_library_version() {
  unsigned major = 0, minor = 0, release = 0;
  H5get_libversion(&major, &minor, &release);
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(release);
}

}  // namespace vericache
