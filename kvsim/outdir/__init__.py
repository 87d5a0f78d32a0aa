"""Output safety: kvsim deletes or replaces only what kvsim wrote. Every command that writes uses this.

Rules (user-facing text: docs/outputs.md):

* **Output directories** (``run``, ``sweep``, ``compare``, ``calibrate``) carry a marker file,
  :data:`MARKER` (``.kvsim-output.json``), recording the command that wrote the directory, whether
  it is complete, and every file and directory kvsim wrote there (paths relative to it).
* A path that does not exist, or an empty directory, may be used. A directory with a marker is a
  kvsim directory: a rerun of the same command replaces it, ``--force`` also lets another kvsim
  command replace it. Only what the marker lists is removed: anything else (a user's ``notes.txt``
  or ``compare-mine/``, another command's output nested inside) is moved into the new directory.
  A non-empty directory without a marker is never touched, with or without ``--force``.
* Refused outright: ``--out`` equal to, or a parent of, the current directory, the home directory,
  the filesystem root, or a protected input (the scenario file's directory, compared runs).
* Replacement is atomic: the new output is written into a hidden ``.OUT.tmp-<pid>`` next to
  ``OUT`` (marked incomplete) and renamed into place when complete; the old directory is renamed to
  ``.OUT.old-<pid>`` in between. Readers see the old or the new complete directory. Leftovers of a
  killed run are recognised by their marker and dead pid: a temp directory is removed, an old
  directory gives the user's files back (or is renamed back to ``OUT`` if the swap was cut short).
  A hidden directory without our marker is never removed.
* **Output files** (``trace convert/generate``, ``report --out FILE``): an existing file is
  replaced only when the marker of the kvsim directory holding it says the same command wrote it
  (:func:`writer_of`: a run's ``summary.json`` is never a report's to replace; its ``report.html``
  is), or with ``--force``. Files are written to a temp name and renamed into place. One written into
  another command's directory is recorded in that marker's ``by`` (name -> command), not in its
  ``written``: the owner keeps it when it replaces the directory.

The package uses the standard library only (``kvsim calibrate`` runs on machines with a bare Python).

Modules: :mod:`~kvsim.outdir.marker` (the marker file and the entries it lists),
:mod:`~kvsim.outdir.checks` (where an output may go), :mod:`~kvsim.outdir.leftovers` (killed runs),
:mod:`~kvsim.outdir.atomic` (a directory written atomically), :mod:`~kvsim.outdir.inplace` (written in
place; removed), :mod:`~kvsim.outdir.files` (single files). Import from ``kvsim.outdir``.
"""

from kvsim.outdir.atomic import adopt_interrupted, atomic_out_dir, commit, finish_killed_commit
from kvsim.outdir.checks import check_creatable, check_not_protected, check_out_dir, check_parent_folders
from kvsim.outdir.files import check_out_file, record_written, write_file_atomic
from kvsim.outdir.inplace import open_in_place, remove_output, set_complete, withdraw_output
from kvsim.outdir.leftovers import clean_leftovers
from kvsim.outdir.marker import (FILE_WRITERS, INCOMPLETE_FILE, MARKER, MARKER_FORMAT, RESUME_FILE, Marker,
                                 read_marker, tree, write_marker, writer_of)

__all__ = ["FILE_WRITERS", "INCOMPLETE_FILE", "MARKER", "MARKER_FORMAT", "RESUME_FILE", "Marker", "adopt_interrupted",
           "atomic_out_dir", "check_creatable", "check_not_protected", "check_out_dir", "check_out_file",
           "check_parent_folders", "clean_leftovers", "commit", "finish_killed_commit", "open_in_place", "read_marker",
           "record_written", "remove_output", "set_complete", "tree", "withdraw_output", "write_file_atomic",
           "write_marker", "writer_of"]
