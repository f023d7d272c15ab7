"""OCR reward for text rendering (FlowGRPO's text task), with RapidOCR as the offline engine.

reward = 1 - min(edit_distance(recognized, target), len(target)) / max(len(target), 1), where target
is the text inside the first pair of quotes of the prompt (the whole prompt if it has none) and both
strings are compared lowercased with all whitespace removed. The string math is plain Python so it
is tested everywhere; only the engine needs ``rapidocr-onnxruntime`` (its wheel ships the ONNX models).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch
from PIL import Image

from .base import Reward, require, to_pil

_QUOTED = re.compile(r"[\"“”](.*?)[\"“”]", re.DOTALL)


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insert, delete, substitute, each cost 1), two-row dynamic programme."""
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return previous[-1]


def extract_quoted_text(prompt: str) -> str:
    """The text the image should show: inside the first pair of quotes, else the whole prompt."""
    match = _QUOTED.search(prompt)
    return match.group(1) if match else prompt


def normalize_ocr_text(text: str) -> str:
    """Lowercase and drop all whitespace, so layout and case do not count as errors."""
    return "".join(text.split()).lower()


def ocr_similarity(recognized: str, target: str) -> float:
    """Normalized edit-distance similarity in [0, 1]; 1 means the target text was read exactly."""
    recognized, target = normalize_ocr_text(recognized), normalize_ocr_text(target)
    distance = min(levenshtein(recognized, target), len(target))
    return 1.0 - distance / max(len(target), 1)


def rapidocr_recognizer(**engine_kwargs: Any) -> Callable[[Image.Image], str]:
    """A recognizer built on RapidOCR: image -> all recognized text boxes joined in reading order."""
    rapidocr = require("rapidocr_onnxruntime", "rapidocr-onnxruntime", "ocr")
    engine = rapidocr.RapidOCR(**engine_kwargs)

    def recognize(image: Image.Image) -> str:
        result, _ = engine(image)
        return "".join(str(box[1]) for box in result or [])

    return recognize


class OcrReward(Reward):
    """Text-rendering reward; ``recognizer`` (PIL image -> text) defaults to RapidOCR.

    Video is scored every ``frame_stride``-th frame and the frame scores are averaged.
    """

    name = "ocr"

    def __init__(
        self,
        recognizer: Callable[[Image.Image], str] | None = None,
        frame_stride: int = 1,
        **engine_kwargs: Any,
    ) -> None:
        if frame_stride < 1:
            raise ValueError(f"frame_stride must be >= 1, got {frame_stride}")
        self.frame_stride = frame_stride
        self.recognizer = recognizer if recognizer is not None else rapidocr_recognizer(**engine_kwargs)

    def score(self, images: torch.Tensor, prompts: list[str], latents: torch.Tensor | None) -> torch.Tensor:
        return torch.tensor(
            [
                ocr_similarity(self.recognizer(image), extract_quoted_text(prompt))
                for image, prompt in zip(to_pil(images), prompts)
            ],
            dtype=torch.float64,
        )
