"""Result files of the benchmark scripts: the destination is checked before a run of minutes starts,
and each file is written beside its destination and renamed over it, so that a killed run or a full
disk never leaves half a table over a good one (the hardening issue's rule for every file we write)."""
import os
import sys


def check_destination(path):
    """Exits with one line naming `path` and the system's reason when a file cannot be created there."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        sys.exit(f"{path}: is a directory; give a file name")
    probe = f"{path}.tmp-{os.getpid()}"
    try:
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        sys.exit(f"{path}: cannot write in {folder}: {e.strerror}")


def write_atomically(path, text):
    """Writes `text` to a temporary file beside `path`, flushes it to disk, and renames it over `path`."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
