"""Builds the package with the repository's frozen-data folders inside it.

The folders stay at the top of the repository, where users read and edit them; a built wheel carries a
copy under ``robocasa_shift/data/`` (``core.specs.builtin_data_dir`` reads it there), so an installed
package runs without the repository. Metadata is in setup.cfg.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_FOLDERS = ("perturbations", "stage_specs", "pools", "interventions")


class BuildWithData(build_py):
    """build_py, then the data folders copied into the built package (an editable install reads them in place)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        root = Path(__file__).resolve().parent
        for folder in DATA_FOLDERS:
            shutil.copytree(root / folder, Path(self.build_lib) / "robocasa_shift" / "data" / folder, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildWithData})
