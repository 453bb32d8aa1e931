"""Where the reference policy's weights live: the committed folder and its manifest's name.

``make train-reference`` writes both; the policy reads them; the manifest's content hash
identifies the weights in every run's manifest.
"""

from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
MANIFEST = "manifest.json"
