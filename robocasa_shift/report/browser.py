"""The report page as a reader's browser shows it: headless Chromium, for screenshots and layout checks.

``make docs`` takes the README's screenshot of the tour's report with :func:`screenshot`; the tests
measure the verdict grid with :func:`measure` at the widths readers use. Chromium is Debian's
(``make setup`` installs it); it runs with a throw-away profile, no network services and no sandbox
(the project's machines run it as root), on local files only.

``python -m robocasa_shift.report.browser PAGE PNG [--width W] [--height H]`` writes a screenshot.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List

from robocasa_shift.errors import Unavailable

TIMEOUT_S = 120
# Measured in the page: the verdict grid's right edge, and whether its box scrolls sideways.
MEASURE_SCRIPT = """<script>
window.addEventListener('load', function () {
  var grid = document.querySelector('table.verdicts');
  var box = grid ? grid.parentElement : null;
  var out = {viewport: window.innerWidth, page_scrolls: document.documentElement.scrollWidth > window.innerWidth};
  if (grid) {
    out.grid_right = grid.getBoundingClientRect().right;
    out.box_scrolls = box.scrollWidth > box.clientWidth;
    out.cells = Array.prototype.map.call(grid.querySelectorAll('td'), function (td) {
      var r = td.getBoundingClientRect();
      return {text: td.innerText, right: r.right};
    });
  }
  var pre = document.createElement('pre');
  pre.id = 'robocasa-shift-measure';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str:
    """The Chromium executable.

    Raises:
        Unavailable: no Chromium on PATH (``make setup`` installs Debian's).
    """
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        raise Unavailable("no chromium on PATH: install Debian's chromium (make setup does)")
    return found


def _run(page: Path, profile: Path, width: int, height: int, *action: str) -> subprocess.CompletedProcess:
    flags = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={profile}", "--allow-file-access-from-files", "--virtual-time-budget=4000",
             f"--window-size={width},{height}", *action, Path(page).resolve().as_uri()]
    return subprocess.run(flags, capture_output=True, text=True, timeout=TIMEOUT_S)


def screenshot(page: Path | str, png: Path | str, width: int = 1280, height: int = 1000) -> Path:
    """The top ``width`` x ``height`` pixels of ``page`` as Chromium draws them, written to ``png``."""
    png = Path(png).resolve()
    with tempfile.TemporaryDirectory(prefix="robocasa-shift-chromium-") as profile:
        _run(Path(page), Path(profile), width, height, f"--screenshot={png}")
    if not png.is_file():
        raise Unavailable(f"chromium wrote no screenshot of {page}")
    return png


def measure(page: Path | str, width: int = 1280) -> Dict[str, Any]:
    """Where the verdict grid of a report page ends in a ``width``-pixel window: ``viewport``, ``grid_right``,
    ``box_scrolls`` (its box scrolls sideways), ``page_scrolls`` and each cell's ``text`` and ``right`` edge.

    A copy of the page's folder (videos left out) gets a measuring script; the page itself is not touched.
    """
    import html

    page = Path(page)
    with tempfile.TemporaryDirectory(prefix="robocasa-shift-chromium-") as scratch:
        copy = Path(scratch) / "page"
        shutil.copytree(page.parent, copy, symlinks=True, ignore=shutil.ignore_patterns("*.mp4"))
        probe = copy / page.name
        probe.write_text(page.read_text().replace("</body>", MEASURE_SCRIPT + "</body>"))
        dom = _run(probe, Path(scratch) / "profile", width, 1000, "--dump-dom").stdout
    found = re.search(r'<pre id="robocasa-shift-measure">(.*?)</pre>', dom, re.S)
    if found is None:
        raise Unavailable(f"chromium did not lay out {page}")
    return json.loads(html.unescape(found.group(1)))


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m robocasa_shift.report.browser", description=screenshot.__doc__)
    parser.add_argument("page", type=Path)
    parser.add_argument("png", type=Path)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=1000)
    args = parser.parse_args(argv)
    print(f"{args.page} -> {screenshot(args.page, args.png, args.width, args.height)}")


if __name__ == "__main__":
    main()
