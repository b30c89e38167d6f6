"""The demo page's voice list and upload message (web/voices.js), run in Node.js: each voice listed once, in
its own group, and the gateway's upload warning shown (issue 35)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node")

pytestmark = pytest.mark.skipif(
    NODE is None,
    reason="needs Node.js to run web/voices.js (apt-get install nodejs); the Chromium tests cover the page",
)


def _run(expression: str) -> object:
    """The JSON value of ``expression``, evaluated with web/voices.js imported as ``voices``."""
    assert NODE is not None
    script = f"import * as voices from {json.dumps((ROOT / 'web' / 'voices.js').as_uri())};\n"
    script += f"console.log(JSON.stringify({expression}));"
    done = subprocess.run(
        [NODE, "--input-type=module", "-e", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


LISTING = {
    "voices": ["joe", "anna"],
    "voice_details": [{"name": "joe", "kind": "builtin", "engines": ["piper"], "language": "en-US"}],
    "uploaded_voices": [{"name": "anna", "engines": []}],
    "cloning_engines": [],
}


def test_an_uploaded_voice_is_not_listed_as_built_in_too() -> None:
    listed = _run(f"voices.normaliseVoices({json.dumps(LISTING)})")
    assert isinstance(listed, dict)
    assert listed["builtin"] == [{"name": "joe", "language": "en-US", "engine": "piper"}]
    assert [v["name"] for v in listed["uploaded"]] == ["anna"]
    older = {"voices": ["joe", "Anna"], "uploaded_voices": [{"name": "anna"}]}
    assert _run(f"voices.normaliseVoices({json.dumps(older)}).builtin") == [{"name": "joe"}]


def test_the_upload_warning_is_shown() -> None:
    warned = {
        "voice": {"name": "anna"},
        "warning": {"code": "voice_requires_cloning", "message": "use remote"},
    }
    assert _run(f"voices.uploadMessage({json.dumps(warned)})") == "Uploaded voice “anna”. Warning: use remote"
    assert _run("voices.uploadMessage({voice: {name: 'bob'}})") == "Uploaded voice “bob”."
