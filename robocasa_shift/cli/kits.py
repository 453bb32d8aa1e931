"""``standin-kit``: build and verify the robocasa backend's generated stand-in kitchen assets."""

from __future__ import annotations

import time
from pathlib import Path

import click

from robocasa_shift.cli.common import handle_errors


@click.group(name="standin-kit")
def standin_kit_group() -> None:
    """The robocasa backend's stand-in kit: RoboCasa's kitchens on generated primitive geometry.

    RoboCasa's kitchen assets (~10 GB) cannot be downloaded everywhere. A stand-in kit is generated
    from RoboCasa's installed package (its bundled layouts, styles, registries and procedural XML,
    copied; every fixture and object category generated as boxes and cylinders under the names
    RoboCasa reads, flat colours, registry sizes). It shows that kitchens build, reset, pair, step
    and perturb; it says nothing about RoboCasa's success rates. Runs on it must opt in with
    --asset-kit standin and are labelled "STAND-IN KIT - not RoboCasa results" everywhere.

    \b
      robocasa-shift standin-kit build .robocasa-standin
      export ROBOCASA_ASSETS_PATH=$PWD/.robocasa-standin
      robocasa-shift run --backend robocasa --asset-kit standin --task WashLettuce ...
    """


@standin_kit_group.command(name="build")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@handle_errors
def build_command(out_dir: Path) -> None:
    """Generate a stand-in kit into OUT_DIR (a kit already there is replaced; any other content is refused).

    Deterministic: the same RoboCasa version gives the same bytes, file for file. Needs RoboCasa's
    package (.venv-robocasa). OUT_DIR/STANDIN-KIT.json holds each file's SHA-256 and the content hash.
    """
    from robocasa_shift.backends.robocasa_standin import build_kit

    start = time.perf_counter()
    manifest = build_kit(out_dir)
    click.echo(f"stand-in kit v{manifest['version']} from robocasa {manifest['robocasa_version']}: "
               f"{manifest['n_files']} files, sha256 {manifest['sha256']} -> {out_dir} "
               f"({time.perf_counter() - start:.1f} s)")
    click.echo(f"use it with: export ROBOCASA_ASSETS_PATH={out_dir.resolve()}  (and --asset-kit standin)")


@standin_kit_group.command(name="verify")
@click.argument("kit_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@handle_errors
def verify_command(kit_dir: Path) -> None:
    """Check every file of the kit in KIT_DIR against its manifest; exit 3 when one is missing or altered."""
    from robocasa_shift.backends.robocasa_standin import verify_kit

    manifest = verify_kit(kit_dir)
    click.echo(f"stand-in kit v{manifest['version']}: {manifest['n_files']} files intact, sha256 {manifest['sha256']}")
