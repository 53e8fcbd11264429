"""The README shows the notebooks' charts from a real demo run: every image it links is committed."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_every_image_the_readme_shows_is_in_the_repository():
    images = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", (REPO / "README.md").read_text())
    assert {Path(image).name for image in images} == {
        "rollout.png",
        "compliance.png",
        "device.png",
        "fleet.png",
        "quality.png",
        "fleet_metric.png",
    }
    for image in images:
        data = (REPO / image).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, image
