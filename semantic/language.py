"""Which language an intent is written in, told cheaply and without a dependency: Chinese or English.

A model may read one language and not another (an English-only model's scores on Chinese mean little), so
calibration decides per language whether a model's stage of the cascade may decide (semantic/calibrate.py),
and the router needs the intent's language on every call. Telling Chinese from English needs no model: an
intent is Chinese when its CJK characters outnumber its Latin-script words (a Chinese character carries
about what a word does, so "作废发票INV-1043" is Chinese and "convert 100 USD to 人民币" English). Any
other script counts as English: the evaluation set's languages are these two.
"""

from __future__ import annotations

import re
from typing import Literal

Language = Literal["en", "zh"]
HAN = re.compile(r"[\u3400-\u9fff\uf900-\ufaff]")
LATIN_WORD = re.compile(r"[A-Za-z\u00c0-\u024f]+")


def language(text: str) -> Language:
    return "zh" if len(HAN.findall(text)) > len(LATIN_WORD.findall(text)) else "en"
