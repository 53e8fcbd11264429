"""docs/offsets-api.md's "Error examples", run as written against a real offsets API holding what they
assume: `plant/1/temp` with 5 records, and `t` whose record 1 is damaged; each answer is the one shown."""

from __future__ import annotations

import json
import re
import shlex
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.offsets_api.api_harness import ApiHarness, sample_record, write_damaged_log

DOC = Path(__file__).resolve().parents[3] / "docs" / "offsets-api.md"


def examples() -> list[tuple[list[str], str]]:
    """``(curl's words, what the doc shows after it)`` of every example of the section."""
    section = DOC.read_text().split("## Error examples", 1)[1]
    block = section.split("```console\n", 1)[1].split("```", 1)[0]
    found = []
    for example in block.strip().split("\n\n"):
        command, *shown = example.splitlines()
        found.append((shlex.split(command.removeprefix("$ ")), " ".join(line.strip() for line in shown)))
    return found


def get(words: list[str], port: int) -> tuple[int, dict[str, str], Any]:
    url = next(word for word in words if word.startswith("http://")).replace(":9884", f":{port}")
    headers = dict(words[i + 1].split(": ", 1) for i, word in enumerate(words) if word == "-H")
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as answer:
            return answer.status, dict(answer.headers), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), json.loads(error.read())


def test_every_error_example_answers_as_the_doc_shows(tmp_path):
    """The 400 examples showed bodies without the `parameter` field the API adds (the field at fault, as
    the table above them says), so a client written from the examples did not know it."""
    config = write_damaged_log(tmp_path / "store")
    harness = ApiHarness(tmp_path / "store", token="s3cret", config=config)
    try:
        harness.append("plant/1/temp", *(sample_record(n) for n in range(5)))
        shown_examples = examples()
        assert len(shown_examples) == 6
        for words, shown in shown_examples:
            status, headers, body = get(words, harness.port)
            if "-i" in words:  # the status line and the headers shown, then the body
                head, _, text = shown.partition(" {")
                assert head.split()[1] == str(status), words
                for header in re.findall(r"([\w-]+: .+?)(?= [\w-]+: |$)", head.split(None, 3)[3]):
                    name, value = header.split(": ", 1)
                    assert headers.get(name) == value, (words, header)
                expected = json.loads("{" + text)
            else:  # the body, then `# STATUS`
                text, _, code = shown.rpartition("#")
                assert int(code) == status, words
                expected = json.loads(text)
            assert body == expected, words
    finally:
        harness.close()
