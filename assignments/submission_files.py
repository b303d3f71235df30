"""A submission's files, taken as files: never through a link, never from a device.

The grader runs as root (or as the instructor) and copies the student's files into the tree their
code runs in. Followed blindly, a submitted symbolic link to the instructor's checkout hands in the
reference solution, and one to a root-only file or /proc/self/environ copies what the student may
not read into a place their code prints from. So every file the grader takes from a submission
must be a regular file inside it:
- a symbolic link (the file, or a folder on its way) is refused;
- a hard link is refused unless each of its names is inside the submission (a hard link to a
  file elsewhere is that file);
- a named pipe (FIFO), socket or device file is refused (reading one blocks or reads a device);
- a file larger than MAX_SUBMITTED_BYTES is refused.
The refusal names the file. The copy itself (copy_submitted) opens the file with O_NOFOLLOW and
checks the open file (fstat) is the very one checked here, so nothing swapped in between is read.
"""

import os
import stat
from pathlib import Path

from .definition import AssignmentError
from .printable import printable

MAX_SUBMITTED_BYTES = 4 * 2**20  # one source file of the student's; far above any honest one
MAX_ENTRIES = 100_000  # files and folders looked at in one submission
_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC

# path -> (device, inode, how many of its names are inside its submission), for copy_submitted
_VETTED: dict[str, tuple[int, int, int]] = {}


class RefusedSubmission(AssignmentError):
    """A submission the grader will not read: a link, a special file, too large; the message
    names the file."""


def _walk(root: Path) -> dict[str, os.stat_result]:
    """Every entry under `root` (relative path -> lstat), links not followed."""
    entries, folders = {}, [""]
    while folders:
        folder = folders.pop()
        try:
            listing = list(os.scandir(root / folder if folder else root))
        except OSError:
            continue
        for entry in listing:
            rel = f"{folder}/{entry.name}" if folder else entry.name
            try:
                entries[rel] = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if len(entries) > MAX_ENTRIES:
                raise RefusedSubmission(f"the submission holds more than {MAX_ENTRIES:,} files and folders: "
                                        f"submit the assignment's files only")
            if stat.S_ISDIR(entries[rel].st_mode):
                folders.append(rel)
    return entries


def _what_is_wrong(root: Path, rel: str, st: os.stat_result, links_inside: int) -> str | None:
    """Why the entry `rel` cannot be taken as a submitted file, or None."""
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(root / rel)
        except OSError:
            target = "?"
        return f"is a symbolic link (to {target}): submit the file itself, not a link"
    kinds = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket"),
             (stat.S_ISCHR, "a device file"), (stat.S_ISBLK, "a device file"), (stat.S_ISDIR, "a folder"))
    for test, kind in kinds:
        if test(mode):
            return f"is {kind}, not a file"
    if not stat.S_ISREG(mode):
        return "is not a regular file"
    if st.st_nlink > links_inside:
        return (f"is a hard link to a file outside the submission ({st.st_nlink} names, {links_inside} of them in "
                f"it): submit a copy of the file")
    if st.st_size > MAX_SUBMITTED_BYTES:
        return f"is {st.st_size:,} bytes (at most {MAX_SUBMITTED_BYTES:,})"
    return None


def _refuse(rel: str, why: str):
    raise RefusedSubmission(f"refused: {printable(rel, newlines=False)} {printable(why, newlines=False)}. "
                            f"Nothing of this submission was graded.")


def submitted_files(submission: Path, files: list[str]) -> tuple[dict[str, Path], list[str]]:
    """The student's versions of the assignment's `files` (paths relative to the project): at
    their path in the submission, or (a submission of just the edited files) the one file of that
    name anywhere in it; each a regular file inside the submission (module docstring), else
    RefusedSubmission. Returns {path in the project: the submitted file} and notes (a file
    missing, or several of the same name)."""
    root = Path(submission)
    if os.path.islink(root):
        _refuse(root.name, f"is a symbolic link (to {os.readlink(root)}), not the submission's folder")
    entries = _walk(root)
    names_of: dict[tuple[int, int], int] = {}
    for st in entries.values():
        if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
            names_of[st.st_dev, st.st_ino] = names_of.get((st.st_dev, st.st_ino), 0) + 1
    found, notes = {}, []
    for rel in files:
        parts = Path(rel).parts
        for i in range(1, len(parts)):  # a folder on the way that is a link leads outside
            folder = "/".join(parts[:i])
            if folder in entries and not stat.S_ISDIR(entries[folder].st_mode):
                _refuse(folder, _what_is_wrong(root, folder, entries[folder], 1) or "is not a folder")
        chosen = rel if rel in entries else None
        if chosen is None:
            name = Path(rel).name
            same_name = sorted(r for r, st in entries.items() if Path(r).name == name and not stat.S_ISDIR(st.st_mode))
            if len(same_name) == 1:
                chosen = same_name[0]
            elif len(same_name) > 1:
                notes.append(f"{len(same_name)} files named {printable(name, newlines=False)} were submitted; "
                             f"put yours at {rel}")
        if chosen is None:
            notes.append(f"{rel} was not submitted: graded with the unedited (stripped) version")
            continue
        st = entries[chosen]
        why = _what_is_wrong(root, chosen, st, names_of.get((st.st_dev, st.st_ino), 1))
        if why:
            _refuse(chosen, why)
        path = root / chosen
        _VETTED[str(path)] = (st.st_dev, st.st_ino, names_of.get((st.st_dev, st.st_ino), 1))
        found[rel] = path
    return found, notes


def files_read(assignment) -> list[str]:
    """What a submission is: the files of it the grader reads, as paths relative to the project:
    those holding the assignment's functions, and its answer files (find_the_bug's BUG.txt). From
    the grader's definition, never from the submission. The one list `grade`, batch grading and
    the exported autograders all read (read_submission)."""
    from .make import resolve

    return sorted({resolve(f).file for f in assignment.functions} | set(assignment.answer_files))


def read_submission(folder: Path, assignment) -> tuple[dict[str, Path], list[str]]:
    """The student's versions of files_read(assignment) in the submission `folder`
    (submitted_files: each a regular file inside it, else RefusedSubmission), and notes."""
    return submitted_files(Path(folder), files_read(assignment))


def read_submitted(path: Path, limit: int = MAX_SUBMITTED_BYTES) -> bytes:
    """The bytes of a submitted file, opened without following a link (O_NOFOLLOW: a symbolic
    link is refused by the kernel itself) and checked open (fstat): a regular file, the one
    submitted_files checked (same device and inode), with no name outside the submission, at
    most `limit` bytes. A file submitted_files never saw must have a single name."""
    path = Path(path)
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as error:
        if os.path.islink(path):
            _refuse(path.name, f"is a symbolic link (to {os.readlink(path)}): submit the file itself, not a link")
        raise RefusedSubmission(f"{printable(path.name, newlines=False)} could not be read ({error.strerror})") \
            from None
    try:
        st = os.fstat(fd)
        device, inode, links = _VETTED.get(str(path), (st.st_dev, st.st_ino, 1))
        why = _what_is_wrong(path.parent, path.name, st, links)
        if why:
            _refuse(path.name, why)
        if (st.st_dev, st.st_ino) != (device, inode):
            _refuse(path.name, "was replaced by another file while it was being graded")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            _refuse(path.name, f"is more than {limit:,} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def copy_submitted(source: Path, target: Path) -> None:
    """Copy a submitted file (read_submitted) to `target`, a new file of the grader's."""
    data = read_submitted(source)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
