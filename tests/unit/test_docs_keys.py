"""Every code block of docs/keys.md runs, in order, in one namespace (with Sybil)."""

from __future__ import annotations

from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser

from tests.services import REPO


def test_every_code_block_of_the_keys_page_runs() -> None:
    document = Sybil(parsers=[PythonCodeBlockParser()]).parse(REPO / "docs" / "keys.md")
    examples = list(document)
    assert len(examples) >= 8  # the page's blocks, visible and invisible, were all found
    try:
        for example in examples[:-1]:
            example.evaluate()
    finally:  # the last, invisible block ends the testing helper the first one began
        examples[-1].evaluate()
