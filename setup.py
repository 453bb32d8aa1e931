"""Builds the package with the repository's frozen-data folders inside it.

The folders stay at the top of the repository, where users read and edit them; a built wheel carries a
copy under ``robocasa_shift/data/`` (``core.specs.builtin_data_dir`` reads it there), so an installed
package runs without the repository. Metadata is in setup.cfg.

setuptools' scratch folders (``build/``, ``robocasa_shift.egg-info/``) go to a temporary folder removed at
exit, so ``pip wheel .`` and ``pip install .`` leave the checkout as they found it.
"""

import atexit
import shutil
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build import build
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info

SCRATCH = tempfile.mkdtemp(prefix="robocasa-shift-build-")
atexit.register(shutil.rmtree, SCRATCH, True)

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


class BuildOutside(build):
    """build, with its ``build/`` folder outside the checkout."""

    def initialize_options(self):
        super().initialize_options()
        self.build_base = str(Path(SCRATCH) / "build")


class EggInfoOutside(egg_info):
    """egg_info, with its ``*.egg-info`` folder outside the checkout."""

    def initialize_options(self):
        super().initialize_options()
        self.egg_base = SCRATCH


setup(cmdclass={"build": BuildOutside, "build_py": BuildWithData, "egg_info": EggInfoOutside})
