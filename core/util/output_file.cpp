#include "util/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

namespace vericache {
namespace {

std::string folder_of(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

std::string temporary_beside(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid());
}

Status os_error(const std::string& path, const char* doing, int err) {
  return Status::io_error(path + ": cannot " + doing + ": " + std::strerror(err));
}

}  // namespace

Status check_output_path(const std::string& path) {
  if (path.empty()) return Status::invalid_argument("the output path is empty");
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return Status::invalid_argument(path + ": is a directory; give a file name");
  }
  const std::string folder = folder_of(path);
  if (::stat(folder.c_str(), &st) != 0) return os_error(path, ("use the folder " + folder).c_str(), errno);
  if (!S_ISDIR(st.st_mode)) return Status::invalid_argument(path + ": " + folder + " is not a folder");
  const std::string probe = temporary_beside(path);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return os_error(path, "create a file there", errno);
  ::close(fd);
  ::unlink(probe.c_str());
  return Status();
}

Status write_file_atomically(const std::string& path, std::string_view contents) {
  const std::string tmp = temporary_beside(path);
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return os_error(path, "create a file beside it", errno);
  size_t done = 0;
  while (done < contents.size()) {
    const ssize_t n = ::write(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      ::unlink(tmp.c_str());
      return os_error(path, "write", err);
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return os_error(path, "write", err);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return os_error(path, "replace", err);
  }
  return Status();
}

}  // namespace vericache
