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


def cpu_name():
    """The CPU's model name from /proc/cpuinfo (every speed number is recorded beside it)."""
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown CPU"


def provenance(root, targets=("vericache", "vc_bundled_plugins")):
    """What a result was made from: {"commit", "dirty", "date", "cpu"}. `dirty` is true when tracked
    files outside results/ differ from the commit (the record then cannot be re-made from the commit
    alone); results/ holds outputs, which other runs may be rewriting at the same time. First brings
    `targets` in build/ up to date with the tree (a no-op when they are), so that the binaries
    measured are the tree's; exits naming the target when that build fails."""
    import datetime
    import subprocess
    for target in targets:
        built = subprocess.run(["cmake", "--build", os.path.join(root, "build"), "--target", target],
                               capture_output=True, text=True)
        if built.returncode != 0:
            sys.exit(f"building {target} in build/ failed; the benchmark would measure a stale binary:\n"
                     + (built.stdout + built.stderr)[-2000:])
    commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    status = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":!results"],
                            capture_output=True, text=True).stdout.strip()
    return {"commit": commit or "unknown", "dirty": bool(status),
            "date": datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
            "cpu": cpu_name()}


def command_line(invocation, prov):
    """The markdown line naming the command, its commit and whether the tree was clean."""
    tree = "with uncommitted changes" if prov["dirty"] else "clean tree"
    return f"- command: `{invocation}` at commit `{prov['commit']}` ({tree}, {prov['date']})"


if __name__ == "__main__":
    # For the shell scripts, so every record states its provenance the same way:
    #   results_file.py command-line INVOCATION [TARGET ...]   the command line (builds TARGETs first; vericache by default)
    #   results_file.py cpu                                    the CPU's name
    args = sys.argv[1:]
    if args[:1] == ["cpu"] and len(args) == 1:
        print(cpu_name())
    elif args[:1] == ["command-line"] and len(args) >= 2:
        root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
        print(command_line(args[1], provenance(root, tuple(args[2:]) or ("vericache",))))
    else:
        sys.exit("usage: results_file.py command-line INVOCATION [TARGET ...] | results_file.py cpu")
