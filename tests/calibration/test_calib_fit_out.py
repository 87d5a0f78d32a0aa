"""``kvsim calibrate fit --out``: kvsim replaces only what kvsim wrote (an earlier fit's profile), never a
user's file without --force; CPU plumbing data fitted for a GPU preset gets a one-line warning."""

from __future__ import annotations

import pytest

from calib_helpers import CPU_EXAMPLE
from kvsim.calibration.fit import FIT_HEADER, run_fit
from kvsim.errors import CalibrationError


def test_fit_replaces_its_own_output_but_never_a_users_file(tmp_path, capsys):
    out = tmp_path / "prof.yaml"
    run_fit(str(CPU_EXAMPLE), str(out), gpu="H100-SXM-80GB")
    first = out.read_text()
    assert first.startswith(FIT_HEADER)
    run_fit(str(CPU_EXAMPLE), str(out), gpu="H100-SXM-80GB", name="again")  # its own output: replaced
    assert out.read_text() != first and "again" in out.read_text()

    user = tmp_path / "mine.yaml"
    user.write_text("name: my-profile\n")
    with pytest.raises(CalibrationError, match=r"file exists and is not a profile `kvsim calibrate fit` wrote"):
        run_fit(str(CPU_EXAMPLE), str(user), gpu="H100-SXM-80GB")
    assert user.read_text() == "name: my-profile\n"
    run_fit(str(CPU_EXAMPLE), str(user), gpu="H100-SXM-80GB", force=True)
    assert user.read_text().startswith(FIT_HEADER)


def test_fit_of_cpu_data_for_a_gpu_preset_warns_in_one_line(tmp_path, capsys):
    run_fit(str(CPU_EXAMPLE), str(tmp_path / "p.yaml"), gpu="H100-SXM-80GB")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kvsim calibrate fit: warning:") and "'cpu'" in err[0]
    assert "H100-SXM-80GB" in err[0]


def test_docs_and_help_say_what_fit_does_with_an_existing_file():
    from calib_helpers import REPO

    doc = (REPO / "docs" / "calibration.md").read_text()
    assert "never overwrites an existing file" not in doc
    assert "replaced only if an earlier `calibrate fit` wrote it" in doc
    cli = (REPO / "kvsim" / "calibration" / "cli.py").read_text()
    assert "an earlier `calibrate fit` output there is replaced" in cli
